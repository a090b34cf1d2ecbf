#!/usr/bin/env bash
# bench/replicate.sh: node replication (issue 30) against the node's own backup, on this
# machine's disk: a `qsm server` (TLS) takes the first backup of a tree from a client, then
# `replicate node` copies it to a second `qsm server` (TLS) on the same machine; then 5% of the
# files change, the node backs up again and replicates again. Each round starts both servers
# afresh; the servers' data directories are under bench/out (a real disk, not a tmpfs). The
# page cache is warm for the client's read of the tree (its second and later rounds); the
# source server reads its pool, just written, from the cache too.
#
#   bench/replicate.sh [--rounds N] [--tree DIR]   (default 3 rounds; the kernel tree)
#
# Goal (issue 30): replication at least 0.8x the speed of the first backup, i.e. its time at
# most 1.25x the backup's. Writes bench/out/replicate.md and prints it.
set -euo pipefail
export LC_ALL=C
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
ROUNDS=3
TREE=
while [ $# -gt 0 ]; do
	case $1 in
	--rounds) ROUNDS=$2; shift 2 ;;
	--tree) TREE=$2; shift 2 ;;
	*) echo "usage: $0 [--rounds N] [--tree DIR]" >&2; exit 2 ;;
	esac
done
OUT="$REPO/bench/out/replicate"
mkdir -p "$OUT"
if [ -z "$TREE" ]; then
	TREE=$(cd "$REPO" && python3 -c 'import sys; sys.path.insert(0, "bench/suite"); import data; print(data.kernel_tree(1))' | tail -1)
	TREE=$(find "$TREE" -mindepth 1 -maxdepth 1 -type d | head -1)
fi
cargo build --release -p qsm --manifest-path "$REPO/Cargo.toml" >&2
QSM="$REPO/target/release/qsm"
ENTRIES=$(find "$TREE" | wc -l)
BYTES=$(du -sb "$TREE" | cut -f1)

PIDS=()
trap 'kill "${PIDS[@]}" 2>/dev/null || true' EXIT
start() { # start NAME -> URL (a fresh data directory)
	local data="$OUT/$1"
	rm -rf "$data"
	"$QSM" server --data-dir "$data" --listen 127.0.0.1:0 >"$OUT/$1.log" 2>&1 &
	PIDS+=($!)
	for _ in $(seq 100); do grep -q listening "$OUT/$1.log" && break; sleep 0.1; done
	grep -o 'https://[^ ]*' "$OUT/$1.log" | head -1
}
seconds() { python3 -c 'import json,sys; r=json.load(sys.stdin); r=r[0] if isinstance(r,list) else r; print("%.2f" % r["seconds"])'; }
field() { python3 -c "import json,sys; print(json.load(sys.stdin)[\"$1\"])"; }

printf 'bench-password\n' >"$OUT/pw" && chmod 600 "$OUT/pw"
printf 'replication-password\n' >"$OUT/repl.pw" && chmod 600 "$OUT/repl.pw"
rows=()
for ((r = 1; r <= ROUNDS; r++)); do
	kill "${PIDS[@]}" 2>/dev/null || true
	wait 2>/dev/null || true
	PIDS=()
	rm -rf "$OUT/tree"
	cp -a "$TREE" "$OUT/tree"
	SRC_URL=$(start source)
	DR_URL=$(start replica)
	echo bench-password | "$QSM" admin --server "unix:$OUT/source/qsm.sock" register-node bench >/dev/null
	echo replication-password | "$QSM" admin --server "unix:$OUT/replica/qsm.sock" \
		register-admin from-source --privilege replication >/dev/null
	"$QSM" admin --server "unix:$OUT/source/qsm.sock" define server replica --address "$DR_URL" \
		--cert "$OUT/replica/tls/cert.pem" --account from-source --account-password-file "$OUT/repl.pw" >/dev/null
	export QSM_SERVER=$SRC_URL QSM_NODE=bench QSM_PASSWORD_FILE="$OUT/pw" QSM_CA="$OUT/source/tls/cert.pem"
	sync
	backup=$("$QSM" backup --json "$OUT/tree" | seconds)
	sync
	repl_json=$("$QSM" admin --server "unix:$OUT/source/qsm.sock" replicate node bench --json)
	repl=$(echo "$repl_json" | seconds)
	sent=$(echo "$repl_json" | field wire_bytes)
	# 5% of the files change (every 20th, by name), then a backup and a replication again.
	find "$OUT/tree" -type f | sort | awk 'NR % 20 == 0' | while read -r f; do echo "changed $r" >>"$f"; done
	sync
	incr_json=$("$QSM" backup --json "$OUT/tree")
	incr=$(echo "$incr_json" | seconds)
	stored=$(echo "$incr_json" | python3 -c 'import json,sys; print(json.load(sys.stdin)[0]["bytes_stored"])')
	sync
	irepl_json=$("$QSM" admin --server "unix:$OUT/source/qsm.sock" replicate node bench --json)
	irepl=$(echo "$irepl_json" | seconds)
	isent=$(echo "$irepl_json" | field wire_bytes)
	ratio=$(python3 -c "print('%.2f' % ($backup / $repl))")
	iratio=$(python3 -c "print('%.2f' % ($isent / max(1, $stored)))")
	rows+=("| $r | $backup | $repl | $((sent / 1000000)) | $ratio | $incr | $irepl | $stored | $isent | $iratio |")
	echo "round $r: backup ${backup}s, replicate ${repl}s, incremental ${incr}s, its replication ${irepl}s" >&2
done
{
	echo "## Node replication against the node's first backup (bench/replicate.sh)"
	echo
	echo "$(basename "$TREE"): $ENTRIES entries, $((BYTES / 1000000)) MB; both servers with TLS on 127.0.0.1, data on this machine's disk."
	echo "Speed ratio: the first backup's time over the replication's (the goal: at least 0.8)."
	echo "Incremental: 5% of the files changed; bytes stored by its backup, and bytes the replication sent."
	echo
	echo "| round | first backup s | replicate s | MB sent | speed ratio | incremental backup s | its replication s | bytes stored | bytes sent | sent / stored |"
	echo "|---|---|---|---|---|---|---|---|---|---|"
	printf '%s\n' "${rows[@]}"
} | tee "$OUT.md"
