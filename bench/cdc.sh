#!/usr/bin/env bash
# Chooses the FastCDC sizes for deduplication by measurement (docs/PERFORMANCE.md §6):
#   bench/cdc.sh [CORPUS_DIR] [SMALL_FILE_TREE]
# defaults: $QSM_CORPUS or ../shared/corpus beside the checkout, and /usr/share.
set -euo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
CORPUS=${1:-${QSM_CORPUS:-$REPO/../shared/corpus}}
TREE=${2:-/usr/share}
[[ -d $CORPUS ]] || { echo "cdc.sh: no corpus at $CORPUS (give it as the first argument)" >&2; exit 2; }
command -v xz >/dev/null || { echo "cdc.sh: xz is needed to read the corpus" >&2; exit 2; }
cd "$REPO"
cargo build --release -q -p qsm-client --example cdc_sizes
echo "# $(date -u +%F) $(uname -r), $(nproc) cores: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2-)"
exec target/release/examples/cdc_sizes "$CORPUS" "$TREE"
