#!/bin/bash
# Records the traces the adaptive controller's tests replay (crates/qsm-client/tests/traces):
# the same data backed up once per rung of the ladder to a fresh embedded store on this
# disk, every stage's time per quantum recorded (QSM_ADAPTIVE_RECORD), then grouped by
# bench/suite/trace.py.
#
#   bench/adaptive-trace.sh NAME 'WHAT' PATH     # writes crates/qsm-client/tests/traces/NAME.tsv
#
# QSM_BIN picks the binary (default target/release/qsm).
set -euo pipefail
cd "$(dirname "$0")/.."
name=$1 what=$2 src=$3
bin=${QSM_BIN:-target/release/qsm}
work=$(mktemp -d "$PWD/bench/out/trace.XXXXXX")
trap 'rm -rf "$work"' EXIT
# The adaptive ladder, lightest first; zstd as `auto:LEVEL`, which probes for
# incompressible data as auto's rungs do.
rungs=(none lz4 auto:-1 auto:1 auto:3 auto:6 auto:9 auto:12 auto:19)
args=()
for rung in "${rungs[@]}"; do
    home=$work/home
    rm -rf "$home"
    start=$(date +%s.%N)
    QSM_HOME=$home QSM_ADAPTIVE_RECORD=$work/$rung.rec "$bin" backup --selective \
        --compression "$rung" "$src" >/dev/null
    echo "$rung: $(echo "$(date +%s.%N) - $start" | bc) s" >&2
    label=${rung/auto:/zstd:}
    args+=("$label=$work/$rung.rec")
done
python3 bench/suite/trace.py "$name" "$what" "${args[@]}" \
    >"crates/qsm-client/tests/traces/$name.tsv"
echo "crates/qsm-client/tests/traces/$name.tsv" >&2
