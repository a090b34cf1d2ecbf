"""The ADSM study (seeds/adsm-threaded-hardware-compression.txt): Figure 1, backup throughput
against file size with compression off, in one thread and on all cores, at three link
speeds; Figures 2 and 3, backup and restore time and CPU of a set of big files and a set of
many small files. Plus the study's other headline, the ratio cost of independent quanta."""

import os
import shutil

import data
from data import QUICK_SAMPLE
import plot
from common import (OUT, QSM, Commands, Document, Stat, copy_floor_text, du, fresh, log, mib,
                    repeat, restore_target, run, same_tree)
from servers import Served

CORES = os.cpu_count() or 1
MODES = [("off", ["--compression", "off"]),
         ("1 thread", ["--compression", "auto", "-T", "1"]),
         (f"all cores ({CORES})", ["--compression", "auto", "-T", str(CORES)])]
SIZES = [("500K", 500 * 1024), ("1M", mib(1)), ("2M", mib(2)), ("4M", mib(4)), ("8M", mib(8)),
         ("16M", mib(16))]
LIMITS = ["unlimited", "1Gbit", "10Mbit"]


def _cpu_pct(run_, wall):
    return 100 * run_ / wall / CORES


def fig1(settings):
    cmds = Commands()
    work = os.path.join(OUT, "adsm-fig1")
    # Data per cell: files of the size adding up to TARGET (at least one file); at 10 Mbit/s
    # less, so the slow cells finish (and, in --quick, only sizes up to 2M).
    target = mib(16) if settings.quick else mib(64)
    slow_target = mib(2) if settings.quick else mib(16)
    sets = {}
    for kind in data.KINDS:
        for label, size in SIZES:
            count = max(1, target // size)
            d = data.files_of(kind, size, count, os.path.join(data.DATA, "fig1"))
            sets[kind, label] = sorted(os.path.join(d, f) for f in os.listdir(d))
    doc = Document("adsm-fig1", "ADSM Figure 1: backup throughput against file size",
                   settings, "bench/run.sh adsm-fig1")
    results = {}
    for limit in LIMITS:
        # A fresh server per link, so no pool grows through the whole run.
        with Served(fresh(os.path.join(work, "server"))) as srv:
            for label, size in SIZES:
                if limit == "10Mbit" and size > slow_target:
                    continue
                for mode, args in MODES:
                    for kind in data.KINDS:
                        files = sets[kind, label]
                        if limit == "10Mbit":
                            files = files[:max(1, slow_target // size)]
                        nbytes = sum(os.path.getsize(f) for f in files)
                        lim = [] if limit == "unlimited" else ["--limit-upload", limit]

                        shape = (f"target/release/qsm backup --selective {' '.join(args)} "
                                 f"{' '.join(lim)} $OUT/data/fig1/KIND-SIZExCOUNT/f*")

                        def once(lim=lim, args=args, files=files, shape=shape):
                            return srv.timed(cmds, "backup", "--selective", *args, *lim, *files,
                                             shape=shape)
                        # The warm-up runs unlimited: it warms the same caches, faster.
                        srv.timed(cmds, "backup", "--selective", *args, *files, shape=shape)
                        runs = repeat(settings, once, warmup=False)
                        results[limit, label, mode, kind] = (
                            Stat(nbytes / 1e6 / r.wall for r, _ in runs),
                            Stat(_cpu_pct(r.cpu, r.wall) for r, _ in runs),
                            Stat(_cpu_pct(s, r.wall) for r, s in runs))
                    log(f"fig1 {limit} {label} {mode}: " + ", ".join(
                        f"{k} {results[limit, label, mode, k][0].median:.1f} MB/s"
                        for k in data.KINDS))
    doc.text("""
Each cell backs up files of one size (`qsm backup --selective`, so every run sends them all)
to a `qsm server` on this machine over plaintext TCP on 127.0.0.1; MB/s are of original data
per second of the client's wall time, from process start to exit (login and session
included: the per-file and per-session costs are part of the figure). Client CPU is the
client's user+sys time over its wall time, as a share of the machine's %d cores; the server
(same machine) is reported beside it.
""" % CORES)
    for limit in LIMITS:
        labels = [lab for lab, size in SIZES if (limit, lab, MODES[0][0], "text") in results]
        rows = []
        for lab in labels:
            row = [lab]
            for mode, _ in MODES:
                cells = [results[limit, lab, mode, k] for k in data.KINDS]
                rates = [c[0].median for c in cells]
                row.append(f"{min(rates):.1f}-{max(rates):.1f}")
                row.append(f"{min(c[1].median for c in cells):.0f}-"
                           f"{max(c[1].median for c in cells):.0f}%")
            rows.append(row)
        doc.text(f"## {limit}\n\nMB/s worst-best over the three kinds (text, executables, "
                 "compressed), and the client's CPU (range over the kinds):")
        header = ["file size"]
        for mode, _ in MODES:
            header += [f"{mode} MB/s", f"{mode} CPU"]
        doc.table(header, rows)
        # The detail: every kind, median (min-max) of the runs.
        detail = []
        for lab in labels:
            for kind in data.KINDS:
                row = [lab, kind]
                for mode, _ in MODES:
                    rate, ccpu, scpu = results[limit, lab, mode, kind]
                    row.append(f"{rate.fmt(1)} · {ccpu.median:.0f}% · {scpu.median:.0f}%")
                detail.append(row)
        doc.text("<details><summary>Every kind: MB/s median (min-max) · client CPU · server "
                 "CPU</summary>\n")
        doc.table(["file size", "kind"] + [m for m, _ in MODES], detail, "ll" + "r" * 3)
        doc.text("</details>")
        series = []
        for mode, _ in MODES:
            pts = []
            for lab in labels:
                rates = sorted(results[limit, lab, mode, k][0].median for k in data.KINDS)
                pts.append((rates[1], rates[0], rates[2]))
            series.append((mode, pts))
        doc.plot(plot.line(f"Backup throughput, {limit}", "file size", "MB/s (original data)",
                           labels, series),
                 f"{limit}: MB/s against file size; point = middle kind, whisker = worst-best")
        doc.plot(plot.line(f"Client CPU, {limit}", "file size", "% of the machine", labels,
                           [(mode, [sum(results[limit, lab, mode, k][1].median
                                        for k in data.KINDS) / len(data.KINDS) for lab in labels])
                            for mode, _ in MODES]),
                 f"{limit}: client CPU against file size (mean over the kinds)")
    quanta, costs = _quanta_cost(cmds)
    doc.text("## The ratio cost of independent quanta\n\nThe same 16 MiB compressed as one "
             "stream (a single 16 MiB quantum, the largest QSM allows) and cut into independent quanta "
             "(`qsm compress -c zstd:3 -q SIZE`); the cost is how much larger the "
             "quantized output is.")
    doc.table(["data", "whole file", "1 MiB quanta", "256 KiB quanta", "64 KiB quanta"],
              quanta)
    doc.plot(plot.bars("Ratio cost of independent quanta (zstd-3)", "data",
                       "% larger than one stream", [r[0] for r in quanta],
                       [(q, [c[q] for c in costs]) for q in ("1M", "256K", "64K")]),
             "Ratio cost of independent quanta")
    _write(doc, cmds, results)


def _quanta_cost(cmds):
    """Rows of the table, and per kind {quantum: % larger than one stream}."""
    rows, costs = [], []
    scratch = fresh(os.path.join(OUT, "adsm-quanta"))
    # 16 MiB, the largest quantum: the whole file is then one stream of the same code.
    size = mib(16)
    for kind in data.KINDS:
        src = data.large_file(kind, size)
        sizes = {}
        for q in ("16M", "1M", "256K", "64K"):
            argv = cmds.note([QSM, "compress", "-c", "zstd:3", "-q", q, src])
            out = os.path.join(scratch, "out")
            run(argv, stdout_to=out)
            sizes[q] = os.path.getsize(out)
        whole = sizes["16M"]
        row = [f"{kind} (16 MiB)", f"{size / whole:.3f}:1"]
        cost = {q: 100 * (sizes[q] - whole) / whole for q in ("1M", "256K", "64K")}
        for q in ("1M", "256K", "64K"):
            row.append(f"{size / sizes[q]:.3f}:1 (+{cost[q]:.2f}%)")
        rows.append(row)
        costs.append(cost)
    shutil.rmtree(scratch, ignore_errors=True)
    return rows, costs


def _write(doc, cmds, results):
    lines = []
    for limit in LIMITS:
        for lab, _ in SIZES:
            if (limit, lab, MODES[0][0], "text") not in results:
                continue
            off = sum(results[limit, lab, MODES[0][0], k][0].median for k in data.KINDS)
            allc = sum(results[limit, lab, MODES[2][0], k][0].median for k in data.KINDS)
            lines.append((limit, lab, allc / off))
    summary = ", ".join(f"{lim} {lab}: {x:.2f}x" for lim, lab, x in lines if lab in ("1M", "16M",
                                                                                    "2M"))
    doc.text("## Against the paper\n\nThe paper's headline: compression on all cores ran a "
             "backup nearly twice as fast as no compression on a slow network, and slower "
             "on a fast one. Here, all cores against off (the sum over the three kinds of "
             f"MB/s): {summary}. See docs/PERFORMANCE.md §12 for the discussion.")
    doc.write("""
- Files of each size are consecutive slices of one stream of each kind (data.py): text is the
  Linux kernel's source tarball uncompressed, executables the ELF files of /usr and the Rust
  toolchain, compressed the kernel's .tar.xz.
- Modes: `--compression off`; `--compression auto -T 1` (zstd-3 with incompressible quanta
  stored raw, one compressing thread); `--compression auto -T N` (one thread per core).
- Links: `--limit-upload 1Gbit` and `10Mbit` pace what the client sends (a token bucket on
  the client's socket writes), emulating the link; unlimited is loopback.
- Each cell: one warm-up run (unlimited), then the timed runs.
""", cmds.seen)


def fig23(settings):
    cmds = Commands()
    work = os.path.join(OUT, "adsm-fig23")
    # The paper's rows: one file size each (10 x 256M to 80 x 32M, 2.5 GB), and small files.
    # Here each row holds 3 x 256 MiB (--quick: a quarter), a third of the files of each kind.
    scale = 4 if settings.quick else 1
    total = 3 * mib(256) // scale
    sets = []
    for size in (mib(256) // scale, mib(128) // scale, mib(64) // scale, mib(32) // scale):
        count = total // size
        row = os.path.join(data.DATA, "fig23", f"{size >> 20}Mx{count}")
        if not os.path.isdir(row):
            tmp = fresh(row + ".tmp")
            for kind in data.KINDS:
                part = data.files_of(kind, size, count // len(data.KINDS),
                                     os.path.join(data.DATA, "fig23"))
                for f in sorted(os.listdir(part)):
                    os.link(os.path.join(part, f), os.path.join(tmp, f"{kind}-{f}"))
            os.rename(tmp, row)
        sets.append((f"{count} x {size >> 20} MiB", row))
    small = data.kernel_tree(QUICK_SAMPLE if settings.quick else 1)
    sets.append(("small files", small))
    doc = Document("adsm-fig23", "ADSM Figures 2 and 3: backup and restore of big and small "
                   "files", settings, "bench/run.sh adsm-fig23")
    rows, plots = [], {}
    for name, path in sets:
        nbytes, nfiles = du(path), sum(len(fs) for _, _, fs in os.walk(path))
        for mode, args in MODES:
            with Served(fresh(os.path.join(work, "server"))) as srv:
                backups = repeat(settings, lambda: srv.timed(cmds, "backup", "--selective",
                                                             *args, path))
                target = restore_target("fig23")

                def restore():
                    shutil.rmtree(target, ignore_errors=True)
                    return srv.timed(cmds, "restore", path, "--to", target)
                restores = repeat(settings, restore)
                if not same_tree(path, target):
                    raise SystemExit(f"the restore of {path} differs from it")
                shutil.rmtree(target, ignore_errors=True)
            b = Stat(r.wall for r, _ in backups)
            rs = Stat(r.wall for r, _ in restores)
            rows.append([f"{name} ({nfiles} files, {nbytes / 1e6:.0f} MB)", mode,
                         b.fmt(2, " s"), f"{nbytes / 1e6 / b.median:.0f}",
                         f"{Stat(_cpu_pct(r.cpu, r.wall) for r, _ in backups).median:.0f}% / "
                         f"{Stat(_cpu_pct(s, r.wall) for r, s in backups).median:.0f}%",
                         rs.fmt(2, " s"), f"{nbytes / 1e6 / rs.median:.0f}",
                         f"{Stat(_cpu_pct(r.cpu, r.wall) for r, _ in restores).median:.0f}% / "
                         f"{Stat(_cpu_pct(s, r.wall) for r, s in restores).median:.0f}%"])
            plots[name, mode] = (b, rs)
            log(f"fig23 {name} {mode}: backup {b.median:.2f} s, restore {rs.median:.2f} s")
    doc.text(f"""
As in the paper, each row is one file size ({', '.join(n for n, _ in sets[:-1])}: a third of
the files text, a third executables, a third already compressed; --quick takes a quarter of
the paper's sizes and 3 x 256 MiB / 4 per row, --full 768 MiB per row) and one row of small
files (the Linux kernel's source files: one in {QUICK_SAMPLE} spread over the tree in --quick,
all in --full). Each mode backs a set up with `qsm backup --selective` to a fresh `qsm server`
on 127.0.0.1 (plaintext TCP, unlimited), then restores it with `qsm restore --to` into an
empty directory; the restore is compared with the source.
{copy_floor_text(small)}
CPU: client / server, user+sys over wall, as a share of the machine's {CORES} cores.
""")
    doc.table(["data", "compression", "backup", "MB/s", "CPU client / server", "restore",
               "MB/s", "CPU client / server"], rows, "ll" + "r" * 6)
    for i, title in ((0, "Backup"), (1, "Restore")):
        doc.plot(plot.bars(f"{title} time (Figure {2 + i})", "data", "seconds",
                           [n for n, _ in sets],
                           [(m, [(plots[n, m][i].median, plots[n, m][i].min, plots[n, m][i].max)
                                 for n, _ in sets]) for m, _ in MODES]),
                 f"{title.lower()} time per data set and compression")
    doc.write("""
- Figure 2 of the paper is the backup, Figure 3 the restore; both report time and CPU
  utilisation with compression off, in software on one thread, and (the paper's hardware
  path) here on all cores.
- Each mode: a fresh server; one warm-up backup, then the timed ones (each a selective
  backup, so every run sends everything); one warm-up restore, then the timed ones.
""", cmds.seen)
