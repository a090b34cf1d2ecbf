#!/usr/bin/env bash
# bench/codec.sh: qsm's codecs side by side with the reference tools (lz4, zstd, gzip, pigz)
# on one input, in one run, on one machine, plus the parallel-limit measurement and the ratio
# penalty of independent quanta. Writes bench/out/codec.md and prints it.
#
#   bench/codec.sh [--quick | --runs N] [--input FILE] [--threads N] [--scratch DIR]
#                  [--corpus DIR] [--no-quanta]
#
# Method (also stated in the report):
# - every measurement is 1 untimed warm-up run, then N timed runs (default 3) reported as
#   min/median/max; the warm-up also puts the input in the page cache for every tool alike;
# - MB/s counts ORIGINAL bytes (10^6) per wall-clock second, in both directions;
# - every tool reads a file and writes stdout, redirected to a file in the scratch directory
#   (compression) or to /dev/null (decompression), so all pay the same I/O. qsm's `-o` is not
#   used: it fsyncs and renames its output, which the peer tools do not;
# - every case is decompressed once more and compared with the input (cmp), untimed.
#
# Needs: cargo, apt-get (only when a tool is missing), xz, zstd, lz4, gzip; pigz is optional.
set -euo pipefail
shopt -s inherit_errexit # a failing command inside $(...) fails the caller too (bash >= 4.4)
set -E                   # the ERR trap below also fires in functions and subshells
export LC_ALL=C          # decimal points in $EPOCHREALTIME and printf; byte-wise sort

trap 'echo "codec.sh: failed (exit $?) at line $LINENO: $BASH_COMMAND" >&2' ERR

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
CMDLINE=$(printf '%q ' "$0" "$@")
CMDLINE=${CMDLINE% }

RUNS=3
WARMUP=1
INPUT=""
THREADS=$(nproc)
SCRATCH="$REPO/bench/out"
CORPUS=${QSM_CORPUS:-$REPO/../shared/corpus}
DO_QUANTA=1
DO_CASES=1
# The parallel-limit input: the input repeated to at least this many bytes. The fastest
# decoders get through 100 MB in about 40 ms, where process start-up and the pipeline's fill
# and drain weigh several percent; 400 MB makes every run long enough to measure
# sustained throughput.
PAR_MIN_BYTES=400000000
# The Silesia files of the shared corpus, in the order of the concatenated input.
SILESIA=(dickens mr nci ooffice osdb reymont samba xml)
# The codecs of the parallel-limit measurement, as `qsm compress -c` takes them.
PARALLEL_CODECS=(lz4 zstd:3 gzip:6)
# The parallel speed-up qsm must reach, in % of N independent single-threaded processes.
PARALLEL_TARGET=90

usage() {
	sed -n '2,8p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
	cat <<'EOF'
Options:
  --quick          1 warm-up + 3 timed runs per measurement (the default)
  --runs N         1 warm-up + N timed runs per measurement
  --input FILE     benchmark FILE instead of the concatenated Silesia files
  --threads N      the N of "-T N" and of the parallel-limit test (default: nproc)
  --scratch DIR    scratch directory (default: bench/out, which git ignores)
  --corpus DIR     where the *.xz corpus files are (default: $QSM_CORPUS or /work/shared/corpus)
  --no-quanta      skip the ratio-penalty example (quantum_ratio)
  --parallel-only  measure only the parallel limit
EOF
}

die() {
	echo "codec.sh: $*" >&2
	exit 1
}
log() { printf '[%s] %s\n' "$(date +%T)" "$*" >&2; }
is_count() { [[ $1 =~ ^[1-9][0-9]*$ ]]; }

while (($#)); do
	case $1 in
	--quick) RUNS=3 WARMUP=1 ;;
	--runs)
		(($# >= 2)) || die "--runs needs a number"
		RUNS=$2 && shift
		;;
	--runs=*) RUNS=${1#*=} ;;
	--input)
		(($# >= 2)) || die "--input needs a file"
		INPUT=$2 && shift
		;;
	--input=*) INPUT=${1#*=} ;;
	--threads)
		(($# >= 2)) || die "--threads needs a number"
		THREADS=$2 && shift
		;;
	--threads=*) THREADS=${1#*=} ;;
	--scratch)
		(($# >= 2)) || die "--scratch needs a directory"
		SCRATCH=$2 && shift
		;;
	--scratch=*) SCRATCH=${1#*=} ;;
	--corpus)
		(($# >= 2)) || die "--corpus needs a directory"
		CORPUS=$2 && shift
		;;
	--corpus=*) CORPUS=${1#*=} ;;
	--no-quanta) DO_QUANTA=0 ;;
	--parallel-only) DO_CASES=0 && DO_QUANTA=0 ;;
	-h | --help)
		usage
		exit 0
		;;
	*) die "unknown option $1 (see --help)" ;;
	esac
	shift
done
is_count "$RUNS" || die "--runs must be a positive integer, not '$RUNS'"
is_count "$THREADS" || die "--threads must be a positive integer, not '$THREADS'"
if [[ -n $INPUT ]]; then
	[[ -f $INPUT && -s $INPUT ]] || die "--input $INPUT is not a non-empty file"
	INPUT=$(realpath "$INPUT")
fi
N=$THREADS

# --- scratch directory: never an unignored path inside the repository ----------------------
mkdir -p "$SCRATCH"
SCRATCH=$(realpath "$SCRATCH")
case "$SCRATCH/" in
"$REPO"/*)
	git -C "$REPO" check-ignore -q "$SCRATCH" ||
		die "$SCRATCH is inside the repository but not git-ignored; use bench/out or a path outside"
	;;
esac
RUN="$SCRATCH/run" # compressed files of the current case, deleted after each case
REPORT="$SCRATCH/codec.md"
mkdir -p "$RUN" "$SCRATCH/corpus"

# --- tools ---------------------------------------------------------------------------------
SUDO=()
if (($(id -u) != 0)); then
	SUDO=(sudo)
fi
APT_UPDATED=0
apt_install() {
	if ((APT_UPDATED == 0)); then
		log "apt-get update"
		"${SUDO[@]}" apt-get update -qq
		APT_UPDATED=1
	fi
	log "apt-get install $*"
	"${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive \
		apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}

# Installs what is missing, and nothing else. Entries are COMMAND:PACKAGE.
ensure_tools() {
	local required=(xz:xz-utils zstd:zstd lz4:lz4 gzip:gzip cmp:diffutils)
	# hyperfine is not used here; it is installed for follow-up runs of single cases by hand.
	local optional=(pigz:pigz hyperfine:hyperfine)
	local missing=() wanted=() entry
	for entry in "${required[@]}"; do
		command -v "${entry%%:*}" >/dev/null || missing+=("${entry#*:}")
	done
	for entry in "${optional[@]}"; do
		command -v "${entry%%:*}" >/dev/null || wanted+=("${entry#*:}")
	done
	((${#missing[@]} + ${#wanted[@]})) || return 0
	if ! command -v apt-get >/dev/null || { ((${#SUDO[@]})) && ! command -v sudo >/dev/null; }; then
		((${#missing[@]} == 0)) || die "missing tools (packages: ${missing[*]}); install them first"
		log "optional tools missing and not installable here: ${wanted[*]}"
		return 0
	fi
	((${#missing[@]} == 0)) || apt_install "${missing[@]}"
	for entry in "${wanted[@]}"; do
		apt_install "$entry" || log "could not install $entry; its cases are skipped"
	done
}
ensure_tools
HAVE_PIGZ=0
if command -v pigz >/dev/null; then HAVE_PIGZ=1; fi
# lz4 >= 1.10 compresses on several threads and has -T#; older versions are single-threaded.
# (The help is captured first: `grep -q` on a pipe could kill lz4 with SIGPIPE under pipefail.)
LZ4_MT=0
lz4_help=$(lz4 -h 2>&1 || true)
if [[ $lz4_help == *"-T#"* ]]; then LZ4_MT=1; fi

# --- build ---------------------------------------------------------------------------------
log "cargo build --release -p qsm"
(cd "$REPO" && cargo build --release -p qsm)
if ((DO_QUANTA)); then
	log "cargo build --release -p qsm-codec --example quantum_ratio"
	(cd "$REPO" && cargo build --release -p qsm-codec --example quantum_ratio)
fi
TARGET_DIR=$(cd "$REPO" && cargo metadata --format-version 1 --no-deps |
	grep -o '"target_directory":"[^"]*"' | cut -d'"' -f4)
QSM="$TARGET_DIR/release/qsm"
[[ -x $QSM ]] || die "no qsm binary at $QSM after the build"

# --- corpus and input ----------------------------------------------------------------------
shopt -s nullglob
xz_files=("$CORPUS"/*.xz)
shopt -u nullglob
((${#xz_files[@]})) || die "no *.xz files in $CORPUS (see --corpus)"
for xzf in "${xz_files[@]}"; do
	out="$SCRATCH/corpus/$(basename "$xzf" .xz)"
	if [[ ! -e $out || $xzf -nt $out ]]; then
		log "xz -dc $xzf"
		xz -dc "$xzf" >"$out.part"
		mv "$out.part" "$out"
	fi
done

if [[ -n $INPUT ]]; then
	IN=$INPUT
	# LZW is slow: it gets the first 10 MiB only.
	LZW_IN="$SCRATCH/lzw-input"
	head -c $((10 << 20)) "$IN" >"$LZW_IN"
	LZW_NAME="first 10 MiB of $(basename "$IN")"
else
	IN="$SCRATCH/silesia.cat"
	members=()
	expected=0
	for f in "${SILESIA[@]}"; do
		[[ -f $SCRATCH/corpus/$f ]] || die "$CORPUS has no $f.xz"
		members+=("$SCRATCH/corpus/$f")
		expected=$((expected + $(stat -c %s "$SCRATCH/corpus/$f")))
	done
	stale=0
	[[ -f $IN && $(stat -c %s "$IN") -eq $expected ]] || stale=1
	for f in "${members[@]}"; do
		if [[ $f -nt $IN ]]; then stale=1; fi
	done
	if ((stale)); then
		log "cat ${SILESIA[*]} > $IN"
		cat "${members[@]}" >"$IN.part"
		mv "$IN.part" "$IN"
	fi
	LZW_IN="$SCRATCH/corpus/dickens"
	LZW_NAME="dickens"
fi
SIZE=$(stat -c %s "$IN")

# --- timing --------------------------------------------------------------------------------
# $EPOCHREALTIME (bash 5) reads the clock without forking; `date` is the fallback.
if [[ -n ${EPOCHREALTIME:-} ]]; then
	stamp() { STAMP=$EPOCHREALTIME; }
else
	stamp() { STAMP=$(date +%s.%N); }
fi

# measure CMD [OUT]: runs the shell text CMD with stdout to OUT (default /dev/null), $WARMUP
# times untimed and then $RUNS times timed, and prints "min median max" in seconds.
measure() {
	local cmd=$1 out=${2:-/dev/null} i t0 spans=()
	for ((i = 0; i < WARMUP; i++)); do
		eval "$cmd" >"$out"
	done
	for ((i = 0; i < RUNS; i++)); do
		stamp
		t0=$STAMP
		eval "$cmd" >"$out"
		stamp
		spans+=("$t0 $STAMP")
	done
	printf '%s\n' "${spans[@]}" | awk '{ print $2 - $1 }' | sort -g | awk '
		{ t[NR] = $1 }
		END {
			m = NR % 2 ? t[(NR + 1) / 2] : (t[NR / 2] + t[NR / 2 + 1]) / 2
			printf "%.6f %.6f %.6f\n", t[1], m, t[NR]
		}'
}

# parallel_copies COUNT CMD OUT: COUNT concurrent copies of the shell text CMD; copy i writes
# stdout to OUT.i, or to /dev/null when OUT is /dev/null. Fails if any copy fails.
parallel_copies() {
	local count=$1 cmd=$2 out=$3 i rc=0 pids=()
	for ((i = 0; i < count; i++)); do
		if [[ $out == /dev/null ]]; then
			eval "$cmd" >/dev/null &
		else
			eval "$cmd" >"$out.$i" &
		fi
		pids+=($!)
	done
	for i in "${pids[@]}"; do
		wait "$i" || rc=$?
	done
	return "$rc"
}

# mbps BYTES SECONDS: megabytes (10^6) per second.
mbps() { awk -v b="$1" -v s="$2" 'BEGIN { if (s < 1e-6) s = 1e-6; printf "%.1f", b / 1e6 / s }'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.3f", a / (b > 0 ? b : 1) }'; }
q() { printf '%q' "$1"; }

# --- the side-by-side table ----------------------------------------------------------------
ROWS=()

# bench_case CASE TOOL THREADS INPUT COMPRESS DECOMPRESS: COMPRESS is shell text that writes
# the compressed INPUT to stdout; DECOMPRESS reads $PACKED and writes the original to stdout.
PACKED="$RUN/packed"
bench_case() {
	local name=$1 tool=$2 threads=$3 input=$4 ccmd=$5 dcmd=$6
	local size packed ct dt cmin cmed cmax dmin dmed dmax
	size=$(stat -c %s "$input")
	log "$name: $tool, $threads thread(s)"
	ct=$(measure "$ccmd" "$PACKED")
	packed=$(stat -c %s "$PACKED")
	dt=$(measure "$dcmd")
	eval "$dcmd" | cmp -s - "$input" || die "$tool: decompressed output differs from $input"
	rm -f "$PACKED"
	read -r cmin cmed cmax <<<"$ct"
	read -r dmin dmed dmax <<<"$dt"
	# The fastest run gives the max MB/s and the slowest the min.
	ROWS+=("| $name | $tool | $threads | $(ratio "$size" "$packed") \
| $(mbps "$size" "$cmax") | **$(mbps "$size" "$cmed")** | $(mbps "$size" "$cmin") \
| $(mbps "$size" "$dmax") | **$(mbps "$size" "$dmed")** | $(mbps "$size" "$dmin") |")
	log "  ratio $(ratio "$size" "$packed"), compress $(mbps "$size" "$cmed") MB/s, decompress $(mbps "$size" "$dmed") MB/s (medians)"
}

# qsm_cases CASE SETTING INPUT: qsm at -T1 and at -T N.
qsm_cases() {
	local name=$1 setting=$2 input=$3 t
	for t in 1 "$N"; do
		bench_case "$name" "qsm $setting" "$t" "$input" \
			"$(q "$QSM") compress --quiet -c $setting -T $t $(q "$input")" \
			"$(q "$QSM") decompress --quiet -T $t $(q "$PACKED")"
		if ((N == 1)); then break; fi
	done
	return 0
}

IN_Q=$(q "$IN")
PACKED_Q=$(q "$PACKED")
START=$(date '+%Y-%m-%d %H:%M:%S %Z')
LOAD=$(cut -d' ' -f1-3 /proc/loadavg)
log "input: $IN ($SIZE bytes); $WARMUP warm-up + $RUNS timed runs; N = $N"

if ((DO_CASES)); then
# LZ4. qsm's LZ4 is lz4_flex's default ("fast") mode, comparable to `lz4 -1`.
qsm_cases "lz4" lz4 "$IN"
if ((LZ4_MT)); then
	bench_case "lz4" "lz4 -1" 1 "$IN" "lz4 -q -1 -T1 -c $IN_Q" "lz4 -q -d -c $PACKED_Q"
	bench_case "lz4" "lz4 -1" "$N" "$IN" "lz4 -q -1 -T$N -c $IN_Q" "lz4 -q -d -c $PACKED_Q"
else
	bench_case "lz4" "lz4 -1" 1 "$IN" "lz4 -q -1 -c $IN_Q" "lz4 -q -d -c $PACKED_Q"
fi

# Zstandard. A negative level L is the CLI's --fast=-L.
for level in 1 3 9 -5; do
	if ((level < 0)); then flag="--fast=$((-level))"; else flag="-$level"; fi
	qsm_cases "zstd $level" "zstd:$level" "$IN"
	bench_case "zstd $level" "zstd $flag" 1 "$IN" \
		"zstd -q -T1 $flag -c $IN_Q" "zstd -q -d -c $PACKED_Q"
	if ((N > 1)); then
		bench_case "zstd $level" "zstd $flag" "$N" "$IN" \
			"zstd -q -T$N $flag -c $IN_Q" "zstd -q -d -c $PACKED_Q"
	fi
done

# DEFLATE: qsm's zlib and gzip containers against gzip and pigz.
qsm_cases "deflate 6" zlib:6 "$IN"
qsm_cases "deflate 6" gzip:6 "$IN"
bench_case "deflate 6" "gzip -6" 1 "$IN" "gzip -6 -c $IN_Q" "gzip -d -c $PACKED_Q"
if ((HAVE_PIGZ)); then
	bench_case "deflate 6" "pigz -6" "$N" "$IN" \
		"pigz -6 -p $N -c $IN_Q" "pigz -d -p $N -c $PACKED_Q"
fi

# LZW is slow (tens of MB/s) and has no common peer: qsm only, on a smaller input.
qsm_cases "lzw ($LZW_NAME)" lzw "$LZW_IN"
fi

# --- the parallel limit --------------------------------------------------------------------
# The requirement: qsm -T N reaches >= 90% of what N independent single-threaded processes
# achieve together on the same machine. Measured back to back per codec and direction:
# 1 process at -T1, N concurrent processes at -T1 (aggregate = N x size / wall), and 1 at -T N.
PAR_REPEAT=$(((PAR_MIN_BYTES + SIZE - 1) / SIZE))
PAR_IN="$RUN/parallel-input"
for ((i = 0; i < PAR_REPEAT; i++)); do cat "$IN"; done >"$PAR_IN"
PAR_SIZE=$((SIZE * PAR_REPEAT))
PAR_IN_Q=$(q "$PAR_IN")
PAR_ROWS=()
par_row() { # CODEC DIRECTION SINGLE_TIMES COPIES_TIMES PARALLEL_TIMES
	local s1 smin smed smax pmin pmed pmax agg par pct ok
	read -r _ s1 _ <<<"$3"
	read -r smin smed smax <<<"$4"
	read -r pmin pmed pmax <<<"$5"
	agg=$(mbps $((N * PAR_SIZE)) "$smed")
	par=$(mbps "$PAR_SIZE" "$pmed")
	pct=$(awk -v p="$par" -v a="$agg" 'BEGIN { printf "%.1f", 100 * p / a }')
	ok=$(awk -v p="$pct" -v t="$PARALLEL_TARGET" 'BEGIN { print ((p + 0 >= t + 0) ? "yes" : "**no**") }')
	PAR_ROWS+=("| $1 | $2 | $(mbps "$PAR_SIZE" "$s1") \
| **$agg** ($(mbps $((N * PAR_SIZE)) "$smax")–$(mbps $((N * PAR_SIZE)) "$smin")) \
| $(awk -v a="$agg" -v s="$(mbps "$PAR_SIZE" "$s1")" 'BEGIN { printf "%.2f", a / s }')× \
| **$par** ($(mbps "$PAR_SIZE" "$pmax")–$(mbps "$PAR_SIZE" "$pmin")) | $pct% | $ok |")
	log "  $1 $2: $N x -T1 aggregate $agg MB/s, -T$N $par MB/s = $pct%"
}

for setting in "${PARALLEL_CODECS[@]}"; do
	log "parallel limit: $setting, $N processes at -T1 vs one at -T$N"
	c1="$(q "$QSM") compress --quiet -c $setting -T 1 $PAR_IN_Q"
	cn="$(q "$QSM") compress --quiet -c $setting -T $N $PAR_IN_Q"
	d1="$(q "$QSM") decompress --quiet -T 1 $PACKED_Q"
	dn="$(q "$QSM") decompress --quiet -T $N $PACKED_Q"
	single=$(measure "$c1" "$RUN/single")
	copies=$(measure "parallel_copies $N $(q "$c1") $(q "$RUN/copy")")
	parallel=$(measure "$cn" "$PACKED") # leaves $PACKED for the decompression side
	par_row "$setting" compress "$single" "$copies" "$parallel"
	rm -f "$RUN/single" "$RUN"/copy.*
	single=$(measure "$d1")
	copies=$(measure "parallel_copies $N $(q "$d1") /dev/null")
	parallel=$(measure "$dn")
	par_row "$setting" decompress "$single" "$copies" "$parallel"
	rm -f "$PACKED"
done

# --- ratio penalty of independent quanta ---------------------------------------------------
QUANTA_MD="$SCRATCH/quantum_ratio.md"
if ((DO_QUANTA)); then
	log "ratio penalty of independent quanta (examples/quantum_ratio.rs) on $SCRATCH/corpus"
	# The corpus subdirectory, not $SCRATCH itself: that also holds the concatenated input and
	# the compressed files, which would count twice or distort the averages.
	(cd "$REPO" && cargo run --release -q -p qsm-codec --example quantum_ratio -- \
		"$SCRATCH/corpus") >"$QUANTA_MD.part"
	mv "$QUANTA_MD.part" "$QUANTA_MD"
fi

# --- report --------------------------------------------------------------------------------
# Facts gathered first, each allowed to fail: a missing lscpu must not stop the report.
version() { { "$@" 2>&1 || true; } | head -n 1 | tr -d '*' | sed 's/^ *//; s/ *$//'; }
MODEL=$(lscpu 2>/dev/null | sed -n 's/^Model name: *//p' | head -n 1 || true)
RAM_GB=$(free -g 2>/dev/null | awk '/^Mem:/ { print $2 }' || true)
QSM_REV=$(git -C "$REPO" describe --always --dirty 2>/dev/null || echo unknown)
TOOLS="$(version zstd -V); $(version lz4 -V); $(version gzip --version)"
if ((HAVE_PIGZ)); then TOOLS+="; $(version pigz --version)"; fi
INPUT_DESC=""
if [[ -z $INPUT ]]; then INPUT_DESC=": the Silesia files ${SILESIA[*]} concatenated"; fi
{
	echo "# QSM codec benchmark"
	echo
	echo "- **machine**: ${MODEL:-unknown CPU}, $(nproc) cores (nproc), ${RAM_GB:-?} GB RAM \
(free -g total), Linux $(uname -r)"
	echo "- **date**: $START (load average at start: $LOAD)"
	echo "- **command**: \`$CMDLINE\`"
	echo "- **qsm**: $QSM_REV, $QSM"
	echo "- **tools**: $TOOLS"
	echo "- **input**: \`$IN\`, $SIZE bytes \
($(awk -v b="$SIZE" 'BEGIN { printf "%.1f", b / 1e6 }') MB)$INPUT_DESC"
	echo "- **method**: $WARMUP warm-up + $RUNS timed runs per measurement, MB/s = original \
bytes / 10^6 / wall seconds, shown as min / **median** / max over the runs; ratio = original \
/ compressed size (qsm's includes its frame headers, index and trailer). Every tool reads a \
file in the page cache and writes stdout to a file (compression) or /dev/null \
(decompression). qsm uses its default 1 MiB quanta. N = $N."
	echo
	echo "## Codecs side by side"
	echo
	echo "Threads are those asked for compression. zstd, lz4, gzip and pigz decompress on one \
thread whatever -T/-p say (pigz only moves reading, writing and the check to other threads)."
	echo
	echo "| case | tool | threads | ratio | compress MB/s min | median | max \
| decompress MB/s min | median | max |"
	echo "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"
	printf '%s\n' "${ROWS[@]}"
	echo
	echo "## Parallel limit"
	echo
	echo "Target: \`qsm -T $N\` reaches ≥ $PARALLEL_TARGET% of the aggregate throughput of \
$N independent \`qsm -T1\` processes run concurrently on the same input (aggregate = \
$N × input size / wall time). Measured back to back per codec and direction, on the input \
repeated $PAR_REPEAT times ($PAR_SIZE bytes) so that every run lasts long enough. The \
\"scaling\" column is aggregate / one process alone: what this machine's cores allow."
	echo
	echo "| codec | direction | 1 process -T1 MB/s | $N processes -T1, aggregate MB/s (min–max) \
| scaling | 1 process -T$N MB/s (min–max) | -T$N / aggregate | ≥ $PARALLEL_TARGET% |"
	echo "|---|---|---:|---:|---:|---:|---:|---|"
	printf '%s\n' "${PAR_ROWS[@]}"
	if ((DO_QUANTA)); then
		echo
		# The example prints its own "##" heading and one table per setting.
		cat "$QUANTA_MD"
	fi
} >"$REPORT.part"
mv "$REPORT.part" "$REPORT"
rmdir "$RUN" 2>/dev/null || true

log "report: $REPORT"
cat "$REPORT"
