#!/usr/bin/env bash
# bench/expire.sh: inventory expiration throughput against the number of workers (issue 7;
# TSM's EXPIRE INVENTORY RESOURCE=1..10). Generates a catalog of VERSIONS object versions (default
# 10,000,000) in 20 filespaces with crates/qsm-catalog/examples/expire_bench.rs: five versions per
# path, 60% of them expirable under the default copy group. Then, for each RESOURCE, expires a
# fresh copy of it with the engine `qsm admin expire inventory` runs, and reports versions deleted
# per minute. Writes bench/out/expire.md and prints it.
#
#   bench/expire.sh [VERSIONS] [RESOURCES...]       e.g. bench/expire.sh 2000000 1 2 4
set -euo pipefail
export LC_ALL=C
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VERSIONS=${1:-10000000}
shift || true
RESOURCES=("$@")
[ ${#RESOURCES[@]} -eq 0 ] && RESOURCES=(1 2 3 4 5 6 7 8 9 10)
OUT="$REPO/bench/out/expire"
mkdir -p "$OUT"
cargo build --release -p qsm-catalog --example expire_bench --manifest-path "$REPO/Cargo.toml" >&2
BIN="$REPO/target/release/examples/expire_bench"
DB="$OUT/catalog-$VERSIONS.db"
[ -f "$DB" ] || "$BIN" gen "$DB" "$VERSIONS" 20 2>"$OUT/gen.txt"
ROWS=()
for r in "${RESOURCES[@]}"; do
	cp "$DB" "$OUT/work.db"
	sync
	line=$("$BIN" expire "$OUT/work.db" "$r")
	echo "$line" >&2
	ROWS+=("$(python3 -c 'import json,sys; d=json.loads(sys.argv[1]); print("| %d | %s | %s | %.1f s | **%.2f M/min** |" % (d["resource"], format(d["examined"], ","), format(d["deleted"], ","), d["seconds"], d["per_minute"] / 1e6))' "$line")")
	rm -f "$OUT/work.db" "$OUT/work.db-wal" "$OUT/work.db-shm"
done
{
	echo "# Inventory expiration against the number of workers"
	echo
	echo "- **machine**: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores, $(free -g | awk '/Mem:/ {print $2}') GB RAM, Linux $(uname -r)"
	echo "- **date**: $(date -u '+%Y-%m-%d %H:%M:%S UTC')"
	echo "- **command**: \`bench/expire.sh $VERSIONS ${RESOURCES[*]}\`"
	echo "- **catalog**: $(cat "$OUT/gen.txt" 2>/dev/null || echo "$VERSIONS versions"); SQLite, WAL, synchronous = FULL; each run on a fresh copy"
	echo
	echo "| resource | versions examined | deleted | time | deleted per minute |"
	echo "|---:|---:|---:|---:|---:|"
	printf '%s\n' "${ROWS[@]}"
} | tee "$REPO/bench/out/expire.md"
