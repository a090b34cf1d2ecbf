#!/usr/bin/env bash
# bench/run.sh: the benchmark suite (issue 9). Builds QSM in release mode, installs the peer
# tools, prepares the data, runs the experiments, and writes docs/benchmarks/EXPERIMENT.md
# with tables, an SVG plot per table, the machine and the exact commands.
#
#   bench/run.sh [--quick | --full] [--runs N] [EXPERIMENT...]
#
# Experiments (default: all but adaptive): adsm-fig1 adsm-fig23 tsm-ssd ts7700 ceph peers;
# adaptive (issue 10: auto against every fixed setting, about 20 minutes) and objective
# (issue 33: time and stored bytes of auto, auto:fast, auto:small and the fixed settings,
# embedded and through a server, about 12 minutes) run by name.
# --quick (the default) takes under 15 minutes on 2 cores once built and installed; --full
# uses the papers' sizes, takes hours and writes EXPERIMENT-full.md beside the quick one.
# Every figure is the median of N (default 3) runs
# after an untimed warm-up. Scratch data lives in bench/out/suite (git-ignored).
#
# Installs, idempotently: xz-utils and GNU time (apt-get); for the peers experiment, restic and
# borgbackup (apt-get), rustic and bupstash (cargo install --locked, from crates.io; skipped
# with a note if they do not build, or with QSM_BENCH_NO_CARGO_PEERS=1). Nothing here runs in
# CI.
set -euo pipefail
export LC_ALL=C
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
case " $* " in *" -h "* | *" --help "*) exec python3 "$REPO/bench/suite/run.py" --help ;; esac

# The peer tools are needed by the peers experiment only: run by default, or by name.
names=() skip=
for a in "$@"; do
	if [ -n "$skip" ]; then
		skip=
		continue
	fi
	case "$a" in --runs) skip=1 ;; -*) ;; *) names+=("$a") ;; esac
done
peers=yes
if [ ${#names[@]} -gt 0 ] && [[ " ${names[*]} " != *" peers "* ]]; then peers=; fi

need=()
command -v xz >/dev/null || need+=(xz-utils)
command -v dpkg-deb >/dev/null || need+=(dpkg)
[ -x /usr/bin/time ] || need+=(time) # GNU time: each tool's peak memory
if [ -n "$peers" ]; then
	command -v restic >/dev/null || need+=(restic)
	command -v borg >/dev/null || need+=(borgbackup)
	# bupstash (built from crates.io below) links the system libsodium.
	[ -f /usr/include/sodium.h ] || need+=(libsodium-dev)
	command -v pkg-config >/dev/null || need+=(pkg-config)
fi
if [ ${#need[@]} -gt 0 ]; then
	echo "installing ${need[*]} (apt-get)" >&2
	apt-get update -qq && apt-get install -y -qq "${need[@]}" >/dev/null
fi
export PATH="$HOME/.cargo/bin:$PATH"
if [ -n "$peers" ] && [ -z "${QSM_BENCH_NO_CARGO_PEERS:-}" ]; then
	for crate in rustic-rs:rustic bupstash:bupstash; do
		command -v "${crate#*:}" >/dev/null && continue
		echo "building ${crate%%:*} from crates.io (once; cargo install --locked)" >&2
		cargo install --locked -q "${crate%%:*}" >&2 ||
			echo "note: ${crate%%:*} did not build here; the peers run goes on without it" >&2
	done
fi

cd "$REPO"
cargo build --release -q -p qsm
cargo build --release -q -p qsm-catalog --example expire_bench
cargo build --release -q -p qsm-server --example dbbackup_bench
exec python3 "$REPO/bench/suite/run.py" "$@"
