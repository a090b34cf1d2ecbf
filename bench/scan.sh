#!/usr/bin/env bash
# bench/scan.sh: the scan of an incremental backup with nothing changed, qsm with its parallel
# walker on 1 and on all threads, beside restic and Borg, in one run on the same tree. The
# tree (default /usr/share) is backed up once by each tool, then each tool's unchanged backup
# is timed RUNS times, interleaved, and the median kept. Writes bench/out/scan.md.
#
#   bench/scan.sh [TREE] [--runs N]
set -euo pipefail
export LC_ALL=C
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
TREE=/usr/share
RUNS=5
while [ $# -gt 0 ]; do
	case $1 in
	--runs) RUNS=$2; shift 2 ;;
	*) TREE=$1; shift ;;
	esac
done
OUT="$REPO/bench/out/scan"
rm -rf "$OUT" && mkdir -p "$OUT"
need=()
command -v restic >/dev/null || need+=(restic)
command -v borg >/dev/null || need+=(borgbackup)
if [ ${#need[@]} -gt 0 ]; then
	apt-get update -qq && apt-get install -y -qq "${need[@]}" >/dev/null
fi
cargo build --release -p qsm --manifest-path "$REPO/Cargo.toml" >&2
QSM="$REPO/target/release/qsm"
export RESTIC_PASSWORD=bench BORG_UNKNOWN_UNENCRYPTED_REPO_ACCESS_IS_OK=yes
entries=$(find "$TREE" -xdev | wc -l)

now() { date +%s.%N; }
median() { sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
timed() { local s; s=$(now); "$@" >/dev/null 2>&1; echo "$(now) - $s" | bc -l; }

# First backups (not timed): each tool's repository holds the tree once.
env QSM_HOME="$OUT/qsm" "$QSM" backup --compression lz4 "$TREE" >/dev/null 2>&1 || true
restic init -q -r "$OUT/restic" >/dev/null
restic -q -r "$OUT/restic" backup "$TREE" >/dev/null 2>&1 || true
borg init -e none "$OUT/borg" >/dev/null
borg create --compression lz4 "$OUT/borg::first" "$TREE" >/dev/null 2>&1 || true

declare -A T
tools=(qsm-T1 "qsm-T$(nproc)" restic borg)
for ((r = 0; r < RUNS; r++)); do
	T[qsm-T1]+="$(timed env QSM_HOME="$OUT/qsm" "$QSM" backup -T 1 "$TREE") "
	T[qsm-T$(nproc)]+="$(timed env QSM_HOME="$OUT/qsm" "$QSM" backup -T "$(nproc)" "$TREE") "
	T[restic]+="$(timed restic -q -r "$OUT/restic" backup "$TREE") "
	T[borg]+="$(timed borg create --compression lz4 "$OUT/borg::r$r" "$TREE") "
done

{
	echo "# Incremental backup with nothing changed: the scan"
	echo
	echo "- **machine**: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores, Linux $(uname -r)"
	echo "- **date**: $(date -u '+%Y-%m-%d %H:%M:%S UTC')"
	echo "- **command**: \`bench/scan.sh $TREE --runs $RUNS\`"
	echo "- **tree**: $TREE, $entries entries, page cache warm"
	echo "- **tools**: qsm $(git -C "$REPO" rev-parse --short HEAD) (embedded server); $(restic version | cut -d' ' -f1-2); $(borg --version)"
	echo
	echo "| tool | median s | min s | max s | entries/s |"
	echo "|---|---:|---:|---:|---:|"
	for t in "${tools[@]}"; do
		# shellcheck disable=SC2086
		set -- ${T[$t]}
		m=$(printf '%s\n' "$@" | median)
		lo=$(printf '%s\n' "$@" | sort -g | head -1)
		hi=$(printf '%s\n' "$@" | sort -g | tail -1)
		printf '| %s | %.3f | %.3f | %.3f | %.0f |\n' "$t" "$m" "$lo" "$hi" "$(echo "$entries / $m" | bc -l)"
	done
} | tee "$REPO/bench/out/scan.md"
