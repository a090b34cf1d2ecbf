#!/usr/bin/env bash
# bench/restore-disk.sh: restores of a many-file tree to the disk that holds bench/out (never a
# tmpfs), QSM (embedded) beside restic, `cp -a` and `tar -x` of the same tree, run round-robin
# with `sync` after each, and the best round of each tool reported beside every round: this
# machine's shared disk swings several-fold from minute to minute (issue 24). Also counts the
# system calls of one QSM restore (strace -c -f), the per-file cost a tmpfs would hide.
#
#   bench/restore-disk.sh [--rounds N] [SOURCE_DIR]     (default: a copy of /usr/share)
#
# Times include the `sync` that follows each restore: until then the data is only in the
# page cache. Writes bench/out/restore-disk.md and prints it.
set -euo pipefail
export LC_ALL=C
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
ROUNDS=5
if [ "${1:-}" = "--rounds" ]; then ROUNDS=$2; shift 2; fi
OUT="$REPO/bench/out/restore-disk"
mkdir -p "$OUT"
case "$(stat -f -c %T "$OUT")" in
tmpfs | ramfs) echo "bench/out is on a tmpfs: restores must go to a disk" >&2; exit 1 ;;
esac

need=()
command -v restic >/dev/null || need+=(restic)
command -v strace >/dev/null || need+=(strace)
if [ ${#need[@]} -gt 0 ]; then
	apt-get update -qq && apt-get install -y -qq "${need[@]}" >/dev/null
fi
# QSM_BIN: a qsm binary to measure instead of this tree's release build.
if [ -z "${QSM_BIN:-}" ]; then cargo build --release -p qsm --manifest-path "$REPO/Cargo.toml" >&2; fi
QSM=${QSM_BIN:-$REPO/target/release/qsm}

SRC=${1:-$OUT/src}
if [ -z "${1:-}" ] && [ ! -d "$SRC" ]; then cp -a /usr/share "$SRC"; fi
ENTRIES=$(find "$SRC" | wc -l)
BYTES=$(du -sb "$SRC" | cut -f1)

# --- backups, once --------------------------------------------------------------------------
export QSM_HOME="$OUT/qsm-home"
export RESTIC_REPOSITORY="$OUT/restic" RESTIC_PASSWORD=bench
if [ ! -d "$QSM_HOME" ]; then "$QSM" backup "$SRC" >/dev/null; fi
if [ ! -d "$RESTIC_REPOSITORY" ]; then
	restic init -q && restic backup -q "$SRC" >/dev/null
fi
[ -f "$OUT/src.tar" ] || tar -C "$(dirname "$SRC")" -cf "$OUT/src.tar" "$(basename "$SRC")"

DEST="$OUT/dest"
run() {
	case $1 in
	qsm) "$QSM" restore "$SRC" --to "$DEST" >/dev/null ;;
	restic) restic restore -q latest --target "$DEST" >/dev/null ;;
	cp) cp -a "$SRC" "$DEST" ;;
	tar) mkdir -p "$DEST" && tar -C "$DEST" -xf "$OUT/src.tar" ;;
	esac
}
TOOLS=(qsm restic cp tar)
declare -A BEST
rows=""
for r in $(seq 1 "$ROUNDS"); do
	row="| $r |"
	for t in "${TOOLS[@]}"; do
		rm -rf "$DEST" && sync
		s=$(date +%s.%N)
		run "$t"
		sync
		e=$(date +%s.%N)
		secs=$(echo "$e - $s" | bc)
		row="$row $(printf %.2f "$secs") s |"
		if [ -z "${BEST[$t]:-}" ] || [ "$(echo "$secs < ${BEST[$t]}" | bc)" = 1 ]; then BEST[$t]=$secs; fi
	done
	rows="$rows$row"$'\n'
done
rm -rf "$DEST" && sync
strace -c -f -o "$OUT/strace.txt" "$QSM" restore "$SRC" --to "$DEST" >/dev/null
calls() { local v; v=$(awk -v c="$1" '$NF == c { print $4 }' "$OUT/strace.txt"); echo "${v:-0}"; }
rm -rf "$DEST"

{
	echo "# Restore to disk: $ENTRIES entries, $BYTES bytes ($(basename "$SRC"))"
	echo
	echo "\`bench/restore-disk.sh --rounds $ROUNDS\` on $(uname -n), $(nproc) cores, $(date -u +%Y-%m-%d);"
	echo "restores into $(df --output=source "$OUT" | tail -1) ($(findmnt -no FSTYPE -T "$OUT")), \`sync\` included."
	echo
	echo "| round | QSM embedded | restic $(restic version | awk '{print $2}') | \`cp -a\` | \`tar -x\` |"
	echo "|---|---|---|---|---|"
	printf "%s" "$rows"
	echo "| **best** | **$(printf %.2f "${BEST[qsm]}") s** | **$(printf %.2f "${BEST[restic]}") s** | **$(printf %.2f "${BEST[cp]}") s** | **$(printf %.2f "${BEST[tar]}") s** |"
	echo
	echo "System calls of one QSM restore (strace -c -f): openat $(calls openat), close $(calls close),"
	echo "futex $(calls futex), sched_yield $(calls sched_yield), for $ENTRIES entries."
} | tee "$OUT.md"
