#!/usr/bin/env bash
# bench/journal.sh: journal-based against scanning incremental backup (issue 7; TSM's journal
# based backup). Makes a tree of FILES small files (default 1,000,000, in directories of 1,000),
# backs it up once to a `qsm server` on its local socket while `qsm journal start` watches it,
# then for 0%, 1% and 5% of the files changed times an incremental backup with the journal and
# one scanning (--no-journal), each on its own fresh set of changes, with the client's peak
# memory (/usr/bin/time; the server is another process, so its catalog cache is not counted).
# Writes bench/out/journal.md and prints it.
#
#   bench/journal.sh [FILES]
set -euo pipefail
export LC_ALL=C
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
FILES=${1:-1000000}
OUT="$REPO/bench/out/journal"
TREE="$OUT/tree"
JOURNAL="$OUT/journal.db"
cargo build --release -p qsm --manifest-path "$REPO/Cargo.toml" >&2
QSM="$REPO/target/release/qsm"
rm -rf "$OUT/srv" "$OUT/home" "$JOURNAL" "$JOURNAL"-* "$JOURNAL.lock"
if [ ! -f "$TREE/.complete-$FILES" ]; then
	rm -rf "$TREE"
	python3 - "$TREE" "$FILES" <<'PY'
import os, sys
root, n = sys.argv[1], int(sys.argv[2])
for i in range(n):
    d = os.path.join(root, "d%04d" % (i // 1000))
    if i % 1000 == 0:
        os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "f%07d.txt" % i), "w") as f:
        f.write("file %d of a tree of many small files\n" % i * 3)
open(os.path.join(root, ".complete-%d" % n), "w").close()
PY
fi
"$QSM" server --data-dir "$OUT/srv" --no-tcp > "$OUT/server.log" 2>&1 &
SERVER=$!
"$QSM" journal start --journal "$JOURNAL" "$TREE" > "$OUT/daemon.log" 2>&1 &
DAEMON=$!
trap 'kill $DAEMON $SERVER 2>/dev/null || true' EXIT
until grep -q listening "$OUT/server.log"; do sleep 0.5; done
export QSM_SERVER="unix:$OUT/srv/qsm.sock" QSM_NODE=bench QSM_PASSWORD_FILE="$OUT/pw"
echo bench-password > "$QSM_PASSWORD_FILE" && chmod 600 "$QSM_PASSWORD_FILE"
echo bench-password | "$QSM" admin register-node bench >/dev/null
until grep -q watching "$OUT/daemon.log"; do sleep 0.5; done
start=$(date +%s.%N)
"$QSM" backup --compression lz4 --journal "$JOURNAL" "$TREE" > "$OUT/first.txt"
first=$(echo "$(date +%s.%N) - $start" | bc -l)

round=0
# Changes a fresh PCT% of the files (spread over the tree), then waits for the journal.
change() {
	round=$((round + 1))
	python3 - "$TREE" "$FILES" "$1" "$round" <<'PY'
import os, sys
root, n, pct, rnd = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4])
k = int(n * pct / 100)
step = n // k if k else 0
for j in range(k):
    i = (j * step + rnd * 7) % n
    with open(os.path.join(root, "d%04d" % (i // 1000), "f%07d.txt" % i), "a") as f:
        f.write("changed in round %d\n" % rnd)
PY
	sleep 1
}
# One timed backup: prints "seconds max-RSS-KB examined backed-up journal-used".
backup() {
	/usr/bin/time -f '%e %M' -o "$OUT/time.txt" "$QSM" backup --json --compression lz4 --journal "$JOURNAL" "$@" "$TREE" > "$OUT/run.json"
	python3 - "$OUT/run.json" "$OUT/time.txt" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))[0]
t = open(sys.argv[2]).read().split()
print(t[0], t[1], r["examined"], r["backed_up"], r["journal_used"], r["journal"])
PY
}
# The first backup leaves the journal marked: the next one can use it.
ROWS=()
for pct in 0 1 5; do
	change "$pct"
	j=$(backup)
	change "$pct"
	s=$(backup --no-journal)
	# The scan changed the inventory behind the journal: one more backup makes it valid again.
	backup > /dev/null
	ROWS+=("$pct $j | $s")
done
kill $DAEMON
{
	echo "# Journal-based against scanning incremental backup"
	echo
	echo "- **machine**: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores, $(free -g | awk '/Mem:/ {print $2}') GB RAM, Linux $(uname -r), $(df -h "$OUT" | awk 'NR==2 {print $1}')"
	echo "- **date**: $(date -u '+%Y-%m-%d %H:%M:%S UTC')"
	echo "- **command**: \`bench/journal.sh $FILES\` (qsm $(git -C "$REPO" rev-parse --short HEAD), \`qsm server\` on its local socket, lz4)"
	echo "- **tree**: $FILES files of about 120 bytes in directories of 1,000; first backup $(printf '%.0f' "$first") s; page cache warm"
	echo
	echo "| changed | journal: time | examined | sent | client peak RSS | scan: time | examined | sent | client peak RSS | scan / journal |"
	echo "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
	for row in "${ROWS[@]}"; do
		python3 - "$row" "$FILES" <<'PY'
import sys
row, n = sys.argv[1], int(sys.argv[2])
left, right = row.split(" | ")
l, r = left.split(), right.split()
pct, j, s = l[0], l[1:], r
assert j[4] == "True", "the journal was not used: " + " ".join(j[5:])
print("| %s%% | %.2f s | %s | %s | %.0f MB (%.0f B/file) | %.2f s | %s | %s | %.0f MB (%.0f B/file) | %.1fx |" % (
    pct, float(j[0]), j[2], j[3], int(j[1]) / 1024, int(j[1]) * 1024 / n,
    float(s[0]), s[2], s[3], int(s[1]) / 1024, int(s[1]) * 1024 / n, float(s[0]) / float(j[0])))
PY
	done
} | tee "$REPO/bench/out/journal.md"
