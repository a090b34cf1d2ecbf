#!/usr/bin/env bash
# bench/network.sh: end-to-end backup and restore through a real `qsm server` over TCP on this
# machine (client and server share its 2 cores), the tables of the ADSM study: compression off,
# LZ4, zstd:3 and auto, at unlimited bandwidth and at 1 Gbit/s and 10 Mbit/s limits
# (`--limit-upload`), with the client's CPU utilisation (user+sys over wall).
#
#   bench/network.sh [--runs N]      (default 1 run per cell; the median is reported)
#
# Data (made by bench/backup.sh --data-only): "small" = 2,000 of its small files (~20 MB),
# "large" = dickens + xml from Silesia (15.6 MB). Sizes are kept small so the 10 Mbit/s cells
# finish in seconds; MB/s are of original data. Writes bench/out/network.md and prints it.
set -euo pipefail
export LC_ALL=C
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
RUNS=1
[ "${1:-}" = "--runs" ] && RUNS=$2
OUT="$REPO/bench/out/network"
mkdir -p "$OUT"
bash "$REPO/bench/backup.sh" --data-only
DATA="$REPO/bench/out/backup/data"
cargo build --release -p qsm --manifest-path "$REPO/Cargo.toml" >&2
QSM="$REPO/target/release/qsm"

# The data sets.
if [ ! -d "$OUT/small" ]; then
	mkdir -p "$OUT/small"
	(cd "$DATA/small" && find . -type f | sort >"$OUT/small.list" && head -2000 "$OUT/small.list" | tar -cf - -T - | tar -xf - -C "$OUT/small")
fi
if [ ! -d "$OUT/large" ]; then
	mkdir -p "$OUT/large"
	cp "$DATA/large/dickens" "$DATA/large/xml" "$OUT/large/"
fi

# One server for the whole run, plaintext TCP and TLS.
SRV="$OUT/server"
rm -rf "$SRV"
"$QSM" server --data-dir "$SRV" --listen 127.0.0.1:0 --plaintext >"$OUT/server.log" 2>&1 &
SERVER_PID=$!
TLS_SRV="$OUT/server-tls"
rm -rf "$TLS_SRV"
"$QSM" server --data-dir "$TLS_SRV" --listen 127.0.0.1:0 >"$OUT/server-tls.log" 2>&1 &
TLS_PID=$!
trap 'kill $SERVER_PID $TLS_PID 2>/dev/null || true' EXIT
for log in server server-tls; do
	for _ in $(seq 100); do grep -q listening "$OUT/$log.log" && break; sleep 0.1; done
done
URL=$(grep -o 'http://[^ ]*' "$OUT/server.log" | head -1)
TLS_URL=$(grep -o 'https://[^ ]*' "$OUT/server-tls.log" | head -1)
printf 'bench-password\n' >"$OUT/pw" && chmod 600 "$OUT/pw"
echo bench-password | "$QSM" admin --server "unix:$SRV/qsm.sock" register-node bench >/dev/null
echo bench-password | "$QSM" admin --server "unix:$TLS_SRV/qsm.sock" register-node bench >/dev/null
export QSM_NODE=bench QSM_PASSWORD_FILE="$OUT/pw" QSM_CA="$TLS_SRV/tls/cert.pem"

median() { sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }

# backup URL SET COMPRESSION LIMIT -> "MB/s cpu% ratio" (a selective backup sends everything)
backup() {
	local url=$1 set=$2 comp=$3 limit=$4 args=()
	[ "$limit" != unlimited ] && args=(--limit-upload "$limit")
	QSM_SERVER=$url "$QSM" backup --selective --json --compression "$comp" "${args[@]}" "$OUT/$set" |
		python3 -c 'import json,sys; r=json.load(sys.stdin)[0]; print("%.1f %.0f %.2f" % (r["bytes_read"]/1e6/r["seconds"], 100*r["cpu_seconds"]/r["seconds"], r["bytes_read"]/max(1,r["bytes_stored"])))'
}

row() { # prints a median row of RUNS runs
	local url=$1 set=$2 comp=$3 limit=$4 rates=() cpus=() ratio=
	for ((r = 0; r < RUNS; r++)); do
		read -r mbs cpu ratio < <(backup "$url" "$set" "$comp" "$limit")
		rates+=("$mbs") cpus+=("$cpu")
	done
	echo "| $set | $limit | $comp | $(printf '%s\n' "${rates[@]}" | median) | $(printf '%s\n' "${cpus[@]}" | median)% | $ratio |"
}

cat $(find "$OUT/small" "$OUT/large" -type f) >/dev/null
{
	echo "## Backup through \`qsm server\` (plaintext TCP on 127.0.0.1), MB/s of original data"
	echo
	echo "| data | link | compression | MB/s | client CPU | ratio |"
	echo "|---|---|---|---|---|---|"
	for set in large small; do
		for limit in unlimited 1Gbit 10Mbit; do
			for comp in off lz4 zstd:3 auto; do
				row "$URL" "$set" "$comp" "$limit"
			done
		done
	done
	echo
	echo "## TLS against plaintext (unlimited, auto)"
	echo
	echo "| data | transport | MB/s | client CPU | ratio |"
	echo "|---|---|---|---|---|"
	for set in large small; do
		read -r a b c < <(backup "$URL" "$set" auto unlimited)
		echo "| $set | TCP | $a | $b% | $c |"
		read -r a b c < <(backup "$TLS_URL" "$set" auto unlimited)
		echo "| $set | TLS | $a | $b% | $c |"
	done
	echo
	echo "## Restore through \`qsm server\` (latest versions, unlimited)"
	echo
	echo "| data | seconds | MB/s |"
	echo "|---|---|---|"
	for set in large small; do
		bytes=$(du -sb "$OUT/$set" | cut -f1)
		rm -rf "$OUT/restored"
		s=$(date +%s.%N)
		QSM_SERVER=$URL "$QSM" restore "$OUT/$set" --to "$OUT/restored" >/dev/null
		e=$(date +%s.%N)
		diff -r "$OUT/$set" "$OUT/restored" >/dev/null || { echo "restore of $set differs" >&2; exit 1; }
		echo "| $set | $(echo "$e - $s" | bc -l | xargs printf '%.2f') | $(echo "$bytes / 1000000 / ($e - $s)" | bc -l | xargs printf '%.1f') |"
	done
} | tee "$OUT.md"
