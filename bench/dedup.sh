#!/usr/bin/env bash
# bench/dedup.sh: client-side deduplication and encryption (issue 6), the Tivoli Storage
# Manager article's cases, side by side with restic and Borg in one run, on bench/backup.sh's
# data (20,000 small files and the 8 large Silesia files, together):
#
#   0,1    first full backup into an empty store (every chunk new), dedup on, against dedup off
#   100,2  a second full (selective) backup of the unchanged tree: every file read again,
#          every chunk already stored, with the client's dedup cache warm and with it removed
#          (the server is asked about every id)
#   5%     5% of the small files rewritten and 5% of the large files edited in place (a few
#          bytes inserted near the start), then a selective backup: what is sent
#
# For qsm also: encryption on (with dedup) for 0,1 and 100,2, the dedup cache hit rate, the
# chunks and catalog bytes per chunk, and encryption throughput per core from the summary.
# restic runs `backup --force` (re-reads every file, like a selective backup) and is always
# encrypted and deduplicated; Borg runs `--files-cache=disabled` with `-e none` and
# `--compression zstd,3`. Median of N runs (default 3), each from an empty repository.
# Writes bench/out/dedup.md and prints it.
#
#   bench/dedup.sh [--runs N]
set -euo pipefail
export LC_ALL=C
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
RUNS=3
[ "${1:-}" = "--runs" ] && RUNS=$2
OUT="$REPO/bench/out/dedup"
mkdir -p "$OUT"
need=()
command -v restic >/dev/null || need+=(restic)
command -v borg >/dev/null || need+=(borgbackup)
command -v bc >/dev/null || need+=(bc)
if [ ${#need[@]} -gt 0 ]; then
	apt-get update -qq && apt-get install -y -qq "${need[@]}" >/dev/null
fi
"$REPO/bench/backup.sh" --data-only
cargo build --release -p qsm --manifest-path "$REPO/Cargo.toml" >&2
QSM="$REPO/target/release/qsm"

# The tree: both data sets under one root, copied so the 5% edits leave the originals alone.
SRC="$OUT/src"
fresh_tree() {
	rm -rf "$SRC"
	mkdir -p "$SRC"
	cp -r "$REPO/bench/out/backup/data/small" "$REPO/bench/out/backup/data/large" "$SRC/"
}
# Rewrites every 20th small file (new content) and inserts 16 bytes at 4 KiB into every 20th
# large file (here: the first of 8, as 5% of 8 rounds to 1), keeping sizes near the original.
change_5_percent() {
	python3 - "$SRC" <<'PY'
import os, sys
root = sys.argv[1]
small = sorted(os.path.join(d, f) for d, _, fs in os.walk(f'{root}/small') for f in fs)
for i, p in enumerate(small):
    if i % 20 == 0:
        data = open(p, 'rb').read()
        open(p, 'wb').write(bytes(reversed(data)))
large = sorted(os.path.join(f'{root}/large', f) for f in os.listdir(f'{root}/large'))
for p in large[:max(1, len(large) // 20)]:
    data = open(p, 'rb').read()
    open(p, 'wb').write(data[:4096] + b'sixteen new byte' + data[4096:])
PY
}

now() { date +%s.%N; }
median() { sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
# timed OUTFILE CMD...: runs CMD with stdout to OUTFILE, prints its seconds
timed() {
	local out=$1 s
	shift
	s=$(now)
	"$@" >"$out" 2>"$out.err" || { cat "$out.err" >&2; exit 1; }
	echo "$(now) - $s" | bc -l
}
mb() { echo "$1 / 1000000" | bc -l | xargs printf '%.1f'; }
field() { python3 -c "import json,sys; print(json.load(open(sys.argv[1]))[0][sys.argv[2]])" "$1" "$2"; }
export RESTIC_PASSWORD=bench BORG_UNKNOWN_UNENCRYPTED_REPO_ACCESS_IS_OK=yes BORG_RELOCATED_REPO_ACCESS_IS_OK=yes
export QSM_PASSPHRASE_FILE="$OUT/passphrase" HOME="$OUT/home"
echo "a benchmark passphrase" >"$QSM_PASSPHRASE_FILE"
chmod 600 "$QSM_PASSPHRASE_FILE"

declare -A T S # T[case]: list of seconds; S[case]: stored bytes of the last run
add() { T[$1]="${T[$1]:-} $2"; }
ROWS=()
row() { # case label
	local t
	t=$(printf '%s\n' ${T[$1]} | median)
	ROWS+=("| $2 | $(printf '%.2f' "$t") s | $(echo "$BYTES / $t / 1000000" | bc -l | xargs printf '%.0f') MB/s | $(mb "${S[$1]}") MB |")
	echo "${ROWS[-1]}" >&2
}

fresh_tree
BYTES=$(du -sb "$SRC" | cut -f1)
FILES=$(find "$SRC" -type f | wc -l)
EXTRA=()
for ((r = 0; r < RUNS; r++)); do
	cat $(find "$SRC" -type f) >/dev/null
	for mode in off on enc; do
		store="$OUT/qsm-$mode"
		rm -rf "$store" "$HOME"
		flags=(--dedup on)
		[ $mode = off ] && flags=(--dedup off)
		[ $mode = enc ] && flags+=(--encryption on)
		export QSM_HOME="$store"
		add "qsm-$mode-01" "$(timed "$OUT/j1" "$QSM" backup --json "${flags[@]}" "$SRC")"
		S[qsm-$mode-01]=$(field "$OUT/j1" bytes_stored)
		add "qsm-$mode-1002" "$(timed "$OUT/j2" "$QSM" backup --full --json "${flags[@]}" "$SRC")"
		S[qsm-$mode-1002]=$(field "$OUT/j2" bytes_stored)
		if [ $mode = on ]; then
			hits=$(field "$OUT/j2" cache_hits) chunks=$(field "$OUT/j2" chunks)
			rm -f "$store/dedup.cache"
			add qsm-on-cold "$(timed "$OUT/j3" "$QSM" backup --full --json "${flags[@]}" "$SRC")"
			S[qsm-on-cold]=$(field "$OUT/j3" bytes_stored)
			asked=$(field "$OUT/j3" asked)
			rows=$(python3 -c "import sqlite3,sys; c=sqlite3.connect(sys.argv[1]); print(c.execute('select count(*) from chunks').fetchone()[0])" "$store/catalog.db")
			catalog=$(du -sb "$store/catalog.db" | cut -f1)
			EXTRA=("dedup cache, warm: $hits of $chunks chunks found in the cache (no question asked); cold: $asked ids asked of the server, $(field "$OUT/j3" dedup_chunks) found stored" "catalog: $rows chunk rows for $FILES files, catalog.db $((catalog / 1000)) kB after three backups (about $((catalog / rows)) bytes per chunk row, objects included)")
		fi
		if [ $mode = enc ]; then
			EXTRA+=("encryption: $(mb "$(field "$OUT/j1" encrypted_bytes)") MB sealed in $(field "$OUT/j1" encrypt_seconds) CPU s in the first backup (AES-256-GCM, all workers)")
		fi
		fresh_tree
	done
	for mode in off on; do
		store="$OUT/qsm-$mode"
		rm -rf "$store"
		export QSM_HOME="$store"
		flags=(--dedup "$mode")
		timed "$OUT/j1" "$QSM" backup "${flags[@]}" "$SRC" >/dev/null
		change_5_percent
		add "qsm-$mode-5" "$(timed "$OUT/j2" "$QSM" backup --full --json "${flags[@]}" "$SRC")"
		S[qsm-$mode-5]=$(field "$OUT/j2" bytes_stored)
		fresh_tree
	done
	for tool in restic borg; do
		repo="$OUT/repo-$tool"
		rm -rf "$repo"
		case $tool in
		restic)
			restic init -q -r "$repo" >/dev/null
			one() { restic -q -r "$repo" backup --force "$SRC"; }
			;;
		borg)
			borg init -e none "$repo" >/dev/null
			one() { borg create --files-cache=disabled --compression zstd,3 "$repo::$(date +%s%N)" "$SRC"; }
			;;
		esac
		add "$tool-01" "$(timed "$OUT/t" one)"
		S[$tool-01]=$(du -sb "$repo" | cut -f1)
		add "$tool-1002" "$(timed "$OUT/t" one)"
		S[$tool-1002]=$(($(du -sb "$repo" | cut -f1) - S[$tool-01]))
		change_5_percent
		before=$(du -sb "$repo" | cut -f1)
		add "$tool-5" "$(timed "$OUT/t" one)"
		S[$tool-5]=$(($(du -sb "$repo" | cut -f1) - before))
		fresh_tree
	done
done

for c in 01 1002 5; do
	case $c in
	01) title="0,1: first backup, every chunk new" ;;
	1002) title="100,2: full backup again, nothing changed" ;;
	5) title="5% of the files changed, full backup" ;;
	esac
	ROWS+=("| **$title** | | | |")
	row "qsm-off-$c" "qsm, dedup off"
	row "qsm-on-$c" "qsm, dedup on"
	[ $c = 1002 ] && row qsm-on-cold "qsm, dedup on, no local cache"
	[ $c != 5 ] && row "qsm-enc-$c" "qsm, dedup and encryption on"
	row "restic-$c" "restic (always deduplicated and encrypted)"
	row "borg-$c" "Borg (deduplicated, not encrypted)"
done

{
	echo "# Deduplication and encryption: the TSM article's cases, qsm against restic and Borg"
	echo
	echo "- **machine**: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores, $(free -g | awk '/Mem:/ {print $2}') GB RAM, Linux $(uname -r)"
	echo "- **date**: $(date -u '+%Y-%m-%d %H:%M:%S UTC')"
	echo "- **command**: \`bench/dedup.sh --runs $RUNS\`"
	echo "- **data**: $FILES files, $(mb "$BYTES") MB (bench/backup.sh's small-file tree and the 8 large Silesia files)"
	echo "- **tools**: qsm $(git -C "$REPO" rev-parse --short HEAD) (embedded server, compression auto); $(restic version | cut -d' ' -f1-2) (\`backup --force\`); $(borg --version) (\`-e none --compression zstd,3 --files-cache=disabled\`)"
	echo "- **method**: median of $RUNS runs, each from an empty store; the page cache is warm; stored = bytes the backup added to the store (qsm: frame bytes sent; peers: repository growth)"
	echo
	echo "| case and tool | time | throughput | stored |"
	echo "|---|---:|---:|---:|"
	printf '%s\n' "${ROWS[@]}"
	echo
	printf -- '- %s\n' "${EXTRA[@]}"
} | tee "$REPO/bench/out/dedup.md"
