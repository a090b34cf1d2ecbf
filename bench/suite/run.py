"""bench/run.sh's driver: parses the command line and runs the experiments in order."""

import argparse
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import adaptive  # noqa: E402
import adsm  # noqa: E402
import objective  # noqa: E402
import ceph  # noqa: E402
import peers  # noqa: E402
import ts7700  # noqa: E402
import tsm  # noqa: E402

from common import OUT, CommandFailed, Settings, log  # noqa: E402

EXPERIMENTS = {
    "adsm-fig1": adsm.fig1,
    "adsm-fig23": adsm.fig23,
    "tsm-ssd": tsm.ssd,
    "ts7700": ts7700.ts7700,
    "ceph": ceph.ceph,
    "peers": peers.peers,
    # Issue 10's benchmark, not one of the papers': run by name only (about 20 minutes).
    "adaptive": adaptive.adaptive,
    # Issue 33's: time and stored bytes of auto's objectives and the fixed settings (about
    # 25 minutes).
    "objective": objective.objective,
}
DEFAULT = ["adsm-fig1", "adsm-fig23", "tsm-ssd", "ts7700", "ceph", "peers"]


def main():
    ap = argparse.ArgumentParser(prog="bench/run.sh", description=__doc__)
    size = ap.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true", help="scaled-down sizes (the default)")
    size.add_argument("--full", action="store_true", help="the papers' sizes (hours)")
    ap.add_argument("--runs", type=int, default=3, help="timed runs per figure (at least 3)")
    ap.add_argument("experiments", nargs="*", metavar="EXPERIMENT",
                    help=f"any of {', '.join(EXPERIMENTS)} (default: {' '.join(DEFAULT)})")
    a = ap.parse_args()
    names = a.experiments or DEFAULT
    unknown = [n for n in names if n not in EXPERIMENTS]
    if unknown:
        ap.error(f"unknown experiment {', '.join(unknown)}; choose from {', '.join(EXPERIMENTS)}")
    if a.runs < 3 and not os.environ.get("QSM_BENCH_ALLOW_FEWER_RUNS"):
        ap.error("--runs: at least 3 (every figure is a median of at least 3 runs)")
    settings = Settings(quick=not a.full, runs=a.runs)
    os.makedirs(OUT, exist_ok=True)
    started = time.perf_counter()
    for n in names:
        t = time.perf_counter()
        log(f"== {n}")
        try:
            EXPERIMENTS[n](settings)
        except subprocess.CalledProcessError as e:
            detail = (e.stderr or b"")
            detail = detail.decode(errors="replace") if isinstance(detail, bytes) else detail
            sys.exit(f"bench/run.sh: experiment {n} failed: {e}: {detail.strip()[-500:]}")
        except (CommandFailed, OSError, ValueError) as e:
            # ValueError: a tool's --json output that did not parse.
            sys.exit(f"bench/run.sh: experiment {n} failed: {e}")
        log(f"== {n}: {time.perf_counter() - t:.0f} s")
    log(f"all done in {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
