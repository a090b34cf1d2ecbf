"""Issue 10's benchmark: the backup time of `--compression auto` (adaptive, per quantum)
against every fixed setting (off, lz4, zstd 1, 3 and 9), for bandwidth limits of 10 Mbit/s,
100 Mbit/s, 1 Gbit/s and unlimited, and three kinds of data; then again with one core taken
by a competing process (STAND's CPU-load emulator, `qsm stand load cpu:1`), where the best
fixed choice changes."""

import contextlib
import json
import os
import subprocess

import data
import plot
from common import OUT, QSM, Commands, Document, Stat, fresh, log, mib, repeat
from servers import Served

SETTINGS = ["off", "lz4", "zstd:1", "zstd:3", "zstd:9", "auto"]
FIXED = [s for s in SETTINGS if s != "auto"]


def _cells(quick):
    # Every cell lasts at least about a second at its best setting: auto spends its first
    # 0.3 s or so finding the bottleneck (docs/PERFORMANCE.md §13).
    scale = 1 if quick else 2
    return [("10Mbit", mib(16) * scale), ("100Mbit", mib(64) * scale),
            ("1Gbit", mib(512) * scale), ("unlimited", mib(1024) * scale)]


class Busy:
    """A competing process keeping one core busy: STAND's CPU-load emulator."""

    def __enter__(self):
        self.proc = subprocess.Popen([QSM, "stand", "load", "cpu:1"],
                                     stderr=subprocess.DEVNULL)
        return self

    def __exit__(self, *exc):
        self.proc.kill()
        self.proc.wait()


def _measure(settings, cmds, srv, limit, path, setting):
    lim = [] if limit == "unlimited" else ["--limit-upload", limit]
    shape = (f"target/release/qsm backup --selective --json --compression {setting} "
             f"{' '.join(lim)} $OUT/data/large/KIND-SIZE")

    def once():
        r, _ = srv.timed(cmds, "backup", "--selective", "--json", "--compression", setting,
                         *lim, path, shape=shape)
        return r.wall, json.loads(r.stdout)[0].get("compression", "")
    # The warm-up runs unlimited (same caches, faster); slow links are not worth warming.
    srv.timed(cmds, "backup", "--selective", "--compression", setting, path, shape=shape)
    return repeat(settings, once, warmup=False)


def adaptive(settings):
    cmds = Commands()
    work = os.path.join(OUT, "adaptive")
    doc = Document("adaptive", "Adaptive compression against every fixed setting", settings,
                   "bench/run.sh adaptive")
    loads = [("idle", None), ("one core busy", Busy)]
    results = {}
    for load_name, load in loads:
        for limit, size in _cells(settings.quick):
            # Under load, 10 Mbit/s is link-bound whatever the CPU does: not repeated.
            if load is not None and limit == "10Mbit":
                continue
            for kind in data.KINDS:
                path = data.large_file(kind, size)
                with load() if load else contextlib.nullcontext():
                    for setting in SETTINGS:
                        # A fresh server per setting: every one starts from an empty pool.
                        with Served(fresh(os.path.join(work, "server"))) as srv:
                            results[load_name, limit, kind, setting] = _measure(
                                settings, cmds, srv, limit, path, setting)
                log(f"adaptive {load_name} {limit} {kind}: " + ", ".join(
                    f"{s} {Stat(w for w, _ in results[load_name, limit, kind, s]).median:.2f}"
                    for s in SETTINGS))
    # Every cell's times, once.
    st = {key: Stat(w for w, _ in runs) for key, runs in results.items()}
    doc.text(f"""
Each cell backs up one file ({', '.join(f'{lim}: {size >> 20} MiB' for lim, size in
_cells(settings.quick))}) of one kind (text: the Linux kernel's sources; executables: the
machine's ELF files; compressed: the kernel's .tar.xz) with `qsm backup --selective` to a
`qsm server` on 127.0.0.1 (plaintext TCP), at a bandwidth limit (`--limit-upload`), with
each fixed setting and with `auto`. Times are the client's wall seconds; the best fixed
setting of each cell is in bold; "auto / best" is auto's time over the best fixed setting's;
auto's mix is what `qsm backup --json` reported for its median run. "One core busy":
STAND's CPU-load emulator (`qsm stand load cpu:1`, one thread of integer arithmetic) takes
one of the {os.cpu_count()} cores throughout.
The warm-up runs unlimited; the timed runs are the median of {settings.runs}.
""")
    summary = []
    for load_name, _ in loads:
        rows, ratios, totals = [], [], {s: 0.0 for s in SETTINGS}
        # Per setting, its time over the best fixed setting's, cell by cell (the plot).
        relative = {s: [] for s in SETTINGS}
        cells = [(lim, kind) for lim, _ in _cells(settings.quick) for kind in data.KINDS
                 if (load_name, lim, kind, "auto") in results]
        for lim, kind in cells:
            cell = {s: st[load_name, lim, kind, s] for s in SETTINGS}
            best = min(FIXED, key=lambda s: cell[s].median)
            row = [lim, kind]
            for s in SETTINGS:
                text = cell[s].fmt(2)
                row.append(f"**{text}**" if s == best else text)
                totals[s] += cell[s].median
                relative[s].append(cell[s].median / cell[best].median)
            ratio = relative["auto"][-1]
            ratios.append(ratio)
            runs = sorted(results[load_name, lim, kind, "auto"], key=lambda x: x[0])
            mix = runs[len(runs) // 2][1]
            row += [f"{ratio:.2f}", mix]
            rows.append(row)
        doc.text(f"## {load_name}")
        doc.table(["link", "data"] + SETTINGS + ["auto / best", "auto's mix"], rows,
                  "ll" + "r" * (len(SETTINGS) + 1) + "l")
        doc.plot(plot.bars(f"Backup time over the best fixed setting ({load_name})", "cell",
                           "time / best fixed", [f"{lim} {kind[:4]}" for lim, kind in cells],
                           [(s, relative[s]) for s in SETTINGS]),
                 f"time relative to the best fixed setting, {load_name}")
        within = sum(1 for r in ratios if r <= 1.05)
        total_line = ", ".join(f"{s} {t:.1f} s" for s, t in totals.items())
        beats = [s for s in FIXED if totals["auto"] < totals[s]]
        summary.append(f"- **{load_name}**: auto within 5% of the best fixed setting in "
                       f"{within} of {len(ratios)} cells (worst {max(ratios):.2f}x); the "
                       f"whole table's total time: {total_line}; auto's total is below "
                       f"{len(beats)} of the {len(FIXED)} fixed settings' ({', '.join(beats)}).")
    doc.text("## Against the goal\n\nThe goal (issue 10): auto within 5% of the best fixed "
             "setting in every cell, and better than any single fixed setting over the whole "
             "table.\n\n" + "\n".join(summary))
    doc.write("""
- A fresh server (empty catalog and pool) for each setting of each cell, removed after;
  every backup is selective (sends the whole file).
- `auto` is the adaptive controller of crates/qsm-client/src/adaptive.rs; the fixed
  settings are `--compression off|lz4|zstd:1|zstd:3|zstd:9` (every compressing one with
  the incompressible-data probe off; `auto` probes).
""", cmds.seen)
