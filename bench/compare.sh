#!/usr/bin/env bash
# bench/compare.sh: two builds of qsm side by side, in one run, on the same data: a full
# backup, an incremental with nothing changed, and a restore to this machine's disk (not a
# tmpfs), each on the embedded store and through a `qsm server` on its local socket. The two
# builds run round-robin, ROUNDS rounds, best round each (this machine's shared disk swings
# from minute to minute). For a change that must not make QSM slower (a refactor), run with
# the binaries built before and after it.
#
#   bench/compare.sh OLD_QSM NEW_QSM [ROUNDS]
#
# Data: every file of the corpus directory (../shared/corpus: the Silesia and Canterbury files
# it holds, 103 MB here), and 20,000 files of 1-9 KB cut from them in 200 directories (about
# 100 MB). The source data is read once first, so backups run with it in the page cache.
# Writes bench/out/compare.md.
set -euo pipefail
export LC_ALL=C
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
OLD=${1:?usage: bench/compare.sh OLD_QSM NEW_QSM [ROUNDS]}
NEW=${2:?usage: bench/compare.sh OLD_QSM NEW_QSM [ROUNDS]}
ROUNDS=${3:-3}
CORPUS=${QSM_CORPUS:-$REPO/../shared/corpus}
OUT="$REPO/bench/out/compare"
# On the disk the repository is on: restores must pay for real file creation.
WORK=${QSM_BENCH_DIR:-$REPO/bench/out/compare/work}
mkdir -p "$OUT" "$WORK"

DATA="$OUT/data"
if [ ! -d "$DATA/small" ]; then
	mkdir -p "$DATA/large" "$DATA/small"
	for f in "$CORPUS"/*.xz; do
		name=$(basename "$f" .xz)
		xz -dc "$f" >"$DATA/large/$name"
	done
	# Small files: consecutive 1-9 KB slices of the text and binary corpus files.
	cat "$DATA"/large/* | python3 -c '
import os, sys
data = sys.stdin.buffer.read()
out = sys.argv[1]
pos = 0
for i in range(20000):
    size = 1024 + (i * 7919) % 8192
    if pos + size > len(data):
        pos = 0
    d = os.path.join(out, "d%03d" % (i % 200))
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "f%05d" % i), "wb") as f:
        f.write(data[pos:pos + size])
    pos += size
' "$DATA/small"
fi
cat "$DATA"/large/* >/dev/null
find "$DATA/small" -type f -exec cat {} + >/dev/null

# seconds of one command, its output discarded
t() {
	local s e
	s=$(date +%s.%N)
	"$@" >/dev/null
	e=$(date +%s.%N)
	echo "$e - $s" | bc
}

declare -A best
keep() { # key value: the smallest value seen
	local k=$1 v=$2
	if [ -z "${best[$k]:-}" ] || [ "$(echo "$v < ${best[$k]}" | bc)" = 1 ]; then best[$k]=$v; fi
}

embedded() { # build label set
	local bin=$1 label=$2 set=$3 home="$WORK/home-$2" to="$WORK/to-$2"
	rm -rf "$home" "$to"
	sync
	keep "$label $set embedded backup" "$(t env QSM_HOME="$home" "$bin" backup "$DATA/$set")"
	keep "$label $set embedded incremental" "$(t env QSM_HOME="$home" "$bin" backup "$DATA/$set")"
	sync
	keep "$label $set embedded restore" "$(t env QSM_HOME="$home" "$bin" restore "$DATA/$set" --to "$to")"
	rm -rf "$home" "$to"
}

served() { # build label set
	local bin=$1 label=$2 set=$3 dir="$WORK/server-$2" to="$WORK/to-$2"
	rm -rf "$dir" "$to"
	mkdir -p "$dir"
	"$bin" server --data-dir "$dir/data" --socket "$dir/qsm.sock" --no-tcp >"$dir/log" 2>&1 &
	local pid=$!
	for _ in $(seq 100); do [ -S "$dir/qsm.sock" ] && break; sleep 0.1; done
	printf 'benchpassword\n' >"$dir/pw"
	chmod 600 "$dir/pw"
	"$bin" admin --server "unix:$dir/qsm.sock" register-node bench --new-password-file "$dir/pw" >/dev/null
	local c=(env QSM_SERVER="unix:$dir/qsm.sock" QSM_NODE=bench QSM_PASSWORD_FILE="$dir/pw" "$bin")
	sync
	keep "$label $set server backup" "$(t "${c[@]}" backup "$DATA/$set")"
	keep "$label $set server incremental" "$(t "${c[@]}" backup "$DATA/$set")"
	sync
	keep "$label $set server restore" "$(t "${c[@]}" restore "$DATA/$set" --to "$to")"
	kill "$pid"
	wait "$pid" 2>/dev/null || true
	rm -rf "$dir" "$to"
}

for round in $(seq "$ROUNDS"); do
	echo "round $round of $ROUNDS" >&2
	for set in small large; do
		embedded "$OLD" old "$set"
		embedded "$NEW" new "$set"
		served "$OLD" old "$set"
		served "$NEW" new "$set"
	done
done

{
	echo "# Two builds of qsm, best of $ROUNDS rounds, round-robin"
	echo
	echo "Command: \`bench/compare.sh $OLD $NEW $ROUNDS\` ($(date -u +%F), $(nproc) cores)."
	echo
	echo "| data | store | operation | old (s) | new (s) | new/old |"
	echo "|---|---|---|---|---|---|"
	for set in small large; do
		for store in embedded server; do
			for op in backup incremental restore; do
				o=${best["old $set $store $op"]}
				n=${best["new $set $store $op"]}
				printf '| %s | %s | %s | %.2f | %.2f | %.2f |\n' "$set" "$store" "$op" "$o" "$n" "$(echo "$n / $o" | bc -l)"
			done
		done
	done
} >"$OUT.md"
cat "$OUT.md"
