#!/usr/bin/env bash
# bench/backup.sh: qsm backup / restore side by side with restic and Borg, in one run, on the
# same data: a tree of 20,000 small files (median 5 KB, real text and source from the corpus)
# and the 8 large Silesia files. For each tool and data set: first (full) backup, a second
# backup with nothing changed, and a restore; median of 3 runs (each first backup into a fresh
# repository), repository size. Writes bench/out/backup.md and prints it.
#
#   bench/backup.sh [--runs N]
#
# Fairness notes (also in the report): qsm runs its default, without encryption or dedup
# (bench/dedup.sh runs them, issue 6); Borg runs with
# `-e none` and zstd,3 like qsm's default; restic cannot run unencrypted and uses its own
# `auto` (zstd) compression. Page cache warm for all (each data set is read once first).
set -euo pipefail
export LC_ALL=C
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
RUNS=3
DATA_ONLY=
[ "${1:-}" = "--runs" ] && RUNS=$2
[ "${1:-}" = "--data-only" ] && DATA_ONLY=1
OUT="$REPO/bench/out/backup"
CORPUS=${QSM_CORPUS:-$REPO/../shared/corpus}
mkdir -p "$OUT"

need=()
command -v restic >/dev/null || need+=(restic)
command -v borg >/dev/null || need+=(borgbackup)
command -v xz >/dev/null || need+=(xz-utils)
if [ ${#need[@]} -gt 0 ]; then
	apt-get update -qq && apt-get install -y -qq "${need[@]}" >/dev/null
fi
cargo build --release -p qsm --manifest-path "$REPO/Cargo.toml" >&2
QSM="$REPO/target/release/qsm"

# --- data ----------------------------------------------------------------------------------
DATA="$OUT/data"
if [ ! -d "$DATA/large" ]; then
	mkdir -p "$DATA/large"
	for f in dickens mr nci ooffice osdb reymont samba xml; do xz -dc "$CORPUS/$f.xz" >"$DATA/large/$f"; done
fi
if [ ! -d "$DATA/small" ]; then
	python3 - "$DATA" <<'PY'
import os, random, sys
data = sys.argv[1]
random.seed(7)
src = open(f'{data}/large/samba', 'rb').read() + open(f'{data}/large/dickens', 'rb').read()
for d in range(200):
    p = f'{data}/small/d{d:03}/sub{d % 7}'
    os.makedirs(p, exist_ok=True)
    for f in range(100):
        size = int(random.lognormvariate(8.5, 1.2))  # median about 5 KB
        off = random.randrange(0, len(src) - size - 1)
        open(f'{p}/f{f:03}.txt', 'wb').write(src[off:off + size])
PY
fi
[ -n "$DATA_ONLY" ] && exit 0

now() { date +%s.%N; }
median() { sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
# timed CMD...: seconds of one run
timed() { local s; s=$(now); "$@" >/dev/null 2>&1; echo "$(now) - $s" | bc -l; }

export RESTIC_PASSWORD=bench BORG_UNKNOWN_UNENCRYPTED_REPO_ACCESS_IS_OK=yes BORG_RELOCATED_REPO_ACCESS_IS_OK=yes
ROWS=()
for set in small large; do
	src="$DATA/$set"
	bytes=$(du -sb "$src" | cut -f1)
	files=$(find "$src" -type f | wc -l)
	cat $(find "$src" -type f) >/dev/null # warm the page cache for everyone
	for tool in qsm restic borg; do
		first=() second=() rest=()
		for ((r = 0; r < RUNS; r++)); do
			repo="$OUT/repo-$tool"
			restore="$OUT/restore-$tool"
			rm -rf "$repo" "$restore"
			case $tool in
			qsm)
				first+=("$(timed env QSM_HOME="$repo" "$QSM" backup "$src")")
				second+=("$(timed env QSM_HOME="$repo" "$QSM" backup "$src")")
				rest+=("$(timed env QSM_HOME="$repo" "$QSM" restore "$src" --to "$restore")")
				check="$restore"
				;;
			restic)
				restic init -q -r "$repo" >/dev/null
				first+=("$(timed restic -q -r "$repo" backup "$src")")
				second+=("$(timed restic -q -r "$repo" backup "$src")")
				rest+=("$(timed restic -q -r "$repo" restore latest --target "$restore")")
				check="$restore$src"
				;;
			borg)
				borg init -e none "$repo" >/dev/null
				first+=("$(timed borg create --compression zstd,3 "$repo::a" "$src")")
				second+=("$(timed borg create --compression zstd,3 "$repo::b" "$src")")
				mkdir -p "$restore"
				rest+=("$(cd "$restore" && timed borg extract "$repo::b")")
				check="$restore$src"
				;;
			esac
			diff -rq "$src" "$check" >/dev/null || { echo "$tool: restored $set differs" >&2; exit 1; }
		done
		size=$(du -sb "$OUT/repo-$tool" | cut -f1)
		f=$(printf '%s\n' "${first[@]}" | median)
		s=$(printf '%s\n' "${second[@]}" | median)
		x=$(printf '%s\n' "${rest[@]}" | median)
		ROWS+=("| $set ($files files, $((bytes / 1000000)) MB) | $tool | $(printf '%.2f' "$f") s = **$(echo "$bytes / $f / 1000000" | bc -l | xargs printf '%.0f') MB/s** | $(printf '%.2f' "$s") s | $(printf '%.2f' "$x") s = **$(echo "$bytes / $x / 1000000" | bc -l | xargs printf '%.0f') MB/s** | $((size / 1000000)) MB |")
		echo "${ROWS[-1]}" >&2
		rm -rf "$OUT/repo-$tool" "$OUT/restore-$tool"
	done
done

{
	echo "# Backup side by side: qsm, restic, Borg"
	echo
	echo "- **machine**: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores, $(free -g | awk '/Mem:/ {print $2}') GB RAM, Linux $(uname -r)"
	echo "- **date**: $(date -u '+%Y-%m-%d %H:%M:%S UTC')"
	echo "- **command**: \`bench/backup.sh --runs $RUNS\`"
	echo "- **tools**: qsm $(git -C "$REPO" rev-parse --short HEAD) (embedded server, compression auto = zstd -3 with the incompressible probe, encryption and dedup off); $(restic version | cut -d' ' -f1-2) (encrypted, compression auto); $(borg --version) (\`-e none\`, \`--compression zstd,3\`)"
	echo "- **method**: median of $RUNS runs; each run starts from an empty repository; the source is in the page cache; every restore is compared with the source (diff -r)."
	echo
	echo "| data | tool | first backup | second backup (nothing changed) | restore | repository |"
	echo "|---|---|---:|---:|---:|---:|"
	printf '%s\n' "${ROWS[@]}"
} | tee "$REPO/bench/out/backup.md"
