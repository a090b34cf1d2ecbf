"""The Ceph OSD compression slides (seeds/ceph-osd-hardware-compression.txt): many concurrent
writers (up to 64) against one server, compression off and on, with throughput and the
server's CPU load. The cells are bench/load.py's (real `qsm backup` processes, one node
each, `qsm admin expire inventory` looping on the server meanwhile)."""

import os

import plot
from common import OUT, QSM, Commands, Document, Stat, log
from servers import load

MODES = [("off", "off"), ("on (auto: zstd-3)", "auto"), ("on (lz4)", "lz4")]


def ceph(settings):
    cmds = Commands()
    out = os.path.join(OUT, "ceph")
    os.makedirs(out, exist_ok=True)
    counts = [1, 8, 64] if settings.quick else [1, 2, 4, 8, 16, 32, 64]
    files = 40 if settings.quick else 400
    kib = 80
    mix = load.corpus_mix(out)
    trees = []
    for c in range(max(counts)):
        root = os.path.join(out, "trees", f"silesia-{files}x{kib}k", f"c{c}")
        load.make_tree(root, c, files, kib, mix)
        trees.append(root)
    del mix
    pwfile = os.path.join(out, "pw")
    with open(pwfile, "w") as f:
        f.write(load.PASSWORD + "\n")
    os.chmod(pwfile, 0o600)
    for _, comp in MODES:
        cmds.note([QSM, "backup", "--json", "--compression", comp, "TREE"],
                  {"QSM_SERVER": "http://127.0.0.1:PORT", "QSM_NODE": "nK"})
    res = {}
    for name, comp in MODES:
        for n in counts:
            # The warm-up also restores every client's tree and compares it.
            warm = load.run_cell(out, "sqlite", "dir", 1, n, trees, pwfile, comp, verify=True)
            if warm["failed_clients"] or warm["failed_restores"]:
                raise SystemExit(f"ceph {name} {n} clients: {warm['errors']}")
            runs = [load.run_cell(out, "sqlite", "dir", 1, n, trees, pwfile, comp,
                                  verify=False) for _ in range(settings.runs)]
            if any(r["failed_clients"] for r in runs):
                raise SystemExit(f"ceph {name} {n} clients: {runs[0]['errors']}")
            res[name, n] = runs
            log(f"ceph {name} {n}: {Stat(r['aggregate_mb_s'] for r in runs).median:.0f} MB/s")
    doc = Document("ceph", "Ceph OSD slides: concurrent writers, compression off and on",
                   settings, "bench/run.sh ceph")
    mb = res[MODES[0][0], counts[0]][0]["mb"] / counts[0]
    doc.text(f"""
Each writer is a `qsm backup` process of its own node, backing up its own tree ({files}
files of {kib} KiB on average, {mb:.1f} MB: slices of the Silesia corpus at different
offsets), all started at once against one `qsm server` (SQLite catalog, directory pool) on
127.0.0.1, while `qsm admin expire inventory` loops on the server. Aggregate MB/s is all
writers' original bytes over the wall time of the cell; the server's CPU is its user+sys
over the wall as a share of the machine's {os.cpu_count()} cores, and the clients share the
same cores. In the warm-up run of every cell each writer's tree is restored and compared
with the source.
""")
    rows = []
    for name, _ in MODES:
        for n in counts:
            runs = res[name, n]
            agg = Stat(r["aggregate_mb_s"] for r in runs)
            rows.append([name, str(n), agg.fmt(0),
                         f"{Stat(r['per_client_median_mb_s'] for r in runs).median:.1f}",
                         f"{Stat(r['server_cpu_pct'] for r in runs).median:.0f}%",
                         f"{Stat(r['server_rss_mb'] for r in runs).median:.0f}",
                         f"{Stat(r['probe_p99_ms'] for r in runs).median:.0f}"])
    doc.table(["compression", "writers", "aggregate MB/s", "per writer MB/s (median)",
               "server CPU", "server RSS MB", "request p99 ms"], rows, "ll" + "r" * 5)
    doc.plot(plot.line("Concurrent writers: aggregate throughput", "writers",
                       "MB/s (original data)", [str(n) for n in counts],
                       [(name, [(Stat(r["aggregate_mb_s"] for r in res[name, n]).median,
                                 Stat(r["aggregate_mb_s"] for r in res[name, n]).min,
                                 Stat(r["aggregate_mb_s"] for r in res[name, n]).max)
                                for n in counts]) for name, _ in MODES]),
             "aggregate MB/s against writers")
    doc.plot(plot.line("Concurrent writers: server CPU", "writers", "% of the machine",
                       [str(n) for n in counts],
                       [(name, [Stat(r["server_cpu_pct"] for r in res[name, n]).median
                                for n in counts]) for name, _ in MODES]),
             "server CPU against writers")
    doc.text("""
Against the slides: Ceph compresses on the OSD (the server), so compression there costs the
server's CPU; QSM compresses on the client, so the server's CPU per MB is the same with
compression on or off (it stores fewer bytes when on), and the clients pay for it. On this
machine the clients and the server share the same two cores, so the aggregate is bounded by
the clients' compression: see docs/PERFORMANCE.md §12.
""")
    doc.write("""
- `bench/load.py`'s cells, with `--compression` per mode; SQLite catalog, directory pool,
  one server.
- Each cell: one warm-up run (with restores checked), then the timed runs, each from a
  fresh server, catalog and pool.
""", cmds.seen)
