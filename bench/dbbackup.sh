#!/usr/bin/env bash
# bench/dbbackup.sh: catalog backup and restore (issue 7; TSM's BACKUP DB). Generates a catalog of
# VERSIONS object versions (default 2,000,000) with crates/qsm-catalog/examples/expire_bench.rs,
# then runs crates/qsm-server/examples/dbbackup_bench.rs on it: the server's backup code idle and
# while a writer commits versions into the same catalog, the writer's rate during the backup
# against alone, and the restore. Writes bench/out/dbbackup.md and prints it.
#
#   bench/dbbackup.sh [VERSIONS]
set -euo pipefail
export LC_ALL=C
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VERSIONS=${1:-2000000}
OUT="$REPO/bench/out/dbbackup"
mkdir -p "$OUT"
cargo build --release -p qsm-catalog --example expire_bench --manifest-path "$REPO/Cargo.toml" >&2
cargo build --release -p qsm-server --example dbbackup_bench --manifest-path "$REPO/Cargo.toml" >&2
GEN="$REPO/target/release/examples/expire_bench"
BENCH="$REPO/target/release/examples/dbbackup_bench"
DB="$OUT/catalog-$VERSIONS.db"
[ -f "$DB" ] || "$GEN" gen "$DB" "$VERSIONS" 20 2>"$OUT/gen.txt"
cp "$DB" "$OUT/work.db"
sync
line=$("$BENCH" "$OUT/work.db" "$OUT/work")
echo "$line" >&2
rm -rf "$OUT/work.db" "$OUT/work.db-wal" "$OUT/work.db-shm" "$OUT/work"
{
	echo "# Catalog backup and restore"
	echo
	echo "- **machine**: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores, $(free -g | awk '/Mem:/ {print $2}') GB RAM, Linux $(uname -r)"
	echo "- **date**: $(date -u '+%Y-%m-%d %H:%M:%S UTC')"
	echo "- **command**: \`bench/dbbackup.sh $VERSIONS\`"
	echo "- **catalog**: $(cat "$OUT/gen.txt" 2>/dev/null || echo "$VERSIONS versions"); SQLite, WAL"
	echo
	python3 - "$line" <<'PY'
import json, sys
d = json.loads(sys.argv[1])
mb = lambda b: b / 1e6
print("| measure | value |")
print("|---|---:|")
print("| catalog file | %.0f MB |" % mb(d["catalog_bytes"]))
print("| consistent copy (online backup API) | %.0f MB |" % mb(d["copy_bytes"]))
print("| backup file (zstd-3 QSM stream) | %.0f MB (%.2f:1) |" % (mb(d["backup_bytes"]), d["copy_bytes"] / max(d["backup_bytes"], 1)))
print("| backup, idle | %.1f s (%.0f MB/s of catalog) |" % (d["idle_seconds"], mb(d["copy_bytes"]) / d["idle_seconds"]))
print("| backup, with a writer committing | %.1f s |" % d["busy_seconds"])
print("| writer during the backup / alone | %.0f / %.0f versions/s (%.0f%%) |" % (d["writer_per_s_during"], d["writer_per_s_alone"], 100 * d["writer_per_s_during"] / max(d["writer_per_s_alone"], 1)))
print("| of which the snapshot alone with the writer | %.1f s, writer at %.0f versions/s |" % (d["snapshot_seconds"], d["writer_per_s_during_snapshot"]))
print("| restore (decompress, check, swap) | %.1f s, %s versions |" % (d["restore_seconds"], format(d["restored_versions"], ",")))
PY
} | tee "$REPO/bench/out/dbbackup.md"
