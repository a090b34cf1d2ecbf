#!/usr/bin/env bash
# bench/sparse.sh: a sparse file through backup and restore (issue 22). Makes an 8 GiB file
# holding 10 MiB of data (ten 1 MiB pieces of random bytes spread over it, the rest holes),
# backs it up with the embedded server and restores it, and prints the wall time of each
# (median of RUNS, fresh store each run), the bytes the backup read, and what the original and
# the restored file occupy on disk (du). Prints one Markdown table.
#
#   bench/sparse.sh [RUNS]          (QSM=/path/to/qsm to time a given build instead of release)
set -euo pipefail
export LC_ALL=C
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
RUNS=${1:-5}
if [ -z "${QSM:-}" ]; then
	cargo build --release -p qsm --manifest-path "$REPO/Cargo.toml" >&2
	QSM="$REPO/target/release/qsm"
fi
OUT=$(mktemp -d "${TMPDIR:-/tmp}/qsm-sparse.XXXXXX")
trap 'rm -rf "$OUT"' EXIT
mkdir "$OUT/src"
python3 - "$OUT/src/sparse" <<'PY'
import os, sys
with open(sys.argv[1], "wb") as f:
    f.truncate(8 << 30)
    for i in range(10):
        f.seek(i * (800 << 20) + 12345)
        f.write(os.urandom(1 << 20))
PY
now() { date +%s.%N; }
backups=() restores=()
for run in $(seq "$RUNS"); do
	rm -rf "$OUT/home" "$OUT/out"
	t0=$(now)
	QSM_HOME="$OUT/home" "$QSM" backup "$OUT/src" --json >"$OUT/backup.json"
	t1=$(now)
	QSM_HOME="$OUT/home" "$QSM" restore "$OUT/src" --to "$OUT/out" >/dev/null
	t2=$(now)
	cmp "$OUT/src/sparse" "$OUT/out/sparse"
	backups+=("$(echo "$t1 - $t0" | bc)")
	restores+=("$(echo "$t2 - $t1" | bc)")
done
median() { printf '%s\n' "$@" | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
read_bytes=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))[0]["bytes_read"])' "$OUT/backup.json")
echo "| file | data | backup (median of $RUNS) | bytes read | restore (median of $RUNS) | on disk, original | on disk, restored |"
echo "|---|---:|---:|---:|---:|---:|---:|"
printf '| 8 GiB sparse | 10 MiB | %.3f s | %s | %.3f s | %s | %s |\n' \
	"$(median "${backups[@]}")" "$read_bytes" "$(median "${restores[@]}")" \
	"$(du -h "$OUT/src/sparse" | cut -f1)" "$(du -h "$OUT/out/sparse" | cut -f1)"
