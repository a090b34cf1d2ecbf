"""The Tivoli Storage Manager SSD article (seeds/tsm-ssd-performance.txt): incremental backup
with 5% of the files changed, selective backup with deduplication in its "0,1" (every chunk
new) and "100,2" (every chunk already stored) cases, inventory expiration with 1 and 10
processes, and catalog backup; each with the catalog on the same disk as the pool and on a
separate fast one (a tmpfs stands in for the SSD)."""

import json
import os
import shutil

import data
from data import QUICK_SAMPLE
import plot
from common import (EXAMPLES, OUT, TMPFS, Commands, Document, Stat, fresh, log, repeat, run)
from servers import Served

LOCATIONS = [("same disk as the pool", None), ("tmpfs (stands in for an SSD)", TMPFS)]


def _catalog_dir(where, work):
    return fresh(os.path.join(where or work, "qsm-bench-catalog"))


def backups(settings, cmds, where, work, tree):
    """{case: Stat of seconds} for the incremental and dedup cases, catalog in WHERE."""
    out = {}
    # Incremental: one full backup, then each run changes another 5% of the files.
    cat = _catalog_dir(where, work)
    saved = {}
    try:
        with Served(fresh(os.path.join(work, "server")), catalog=os.path.join(cat, "c.db")) as s:
            s.client(cmds, "backup", tree)
            seed = [0]

            def incremental():
                seed[0] += 1
                for p, content in data.change_files(tree, 0.05, seed[0]).items():
                    saved.setdefault(p, content)
                return s.client(cmds, "backup", tree)
            out["incremental, 5% changed"] = repeat(settings, incremental)
    finally:
        data.restore_files(saved)
    # Selective backup with dedup: 0,1 into an empty server, then 100,2 of the same tree.
    first, second = [], []

    def dedup():
        c = _catalog_dir(where, work)
        with Served(fresh(os.path.join(work, "server")), catalog=os.path.join(c, "c.db")) as s:
            a = s.client(cmds, "backup", "--selective", "--dedup", "on", tree)
            b = s.client(cmds, "backup", "--selective", "--dedup", "on", tree)
        return a, b
    dedup()
    for _ in range(settings.runs):
        a, b = dedup()
        first.append(a)
        second.append(b)
    out['selective with dedup "0,1"'] = first
    out['selective with dedup "100,2"'] = second
    shutil.rmtree(cat, ignore_errors=True)
    return {k: Stat(r.wall for r in v) for k, v in out.items()}


def on_copies(settings, cmds, where, work, db, argv):
    """Runs ARGV(copy, scratch) (an example printing one JSON line) on a fresh copy of the
    catalog DB in WHERE, a warm-up and the timed runs; returns the parsed lines."""
    cat = _catalog_dir(where, work)

    def once():
        copy = os.path.join(cat, "work.db")
        shutil.copy(db, copy)
        line = run(cmds.note(argv(copy, os.path.join(cat, "work")))).stdout
        fresh(cat)
        return json.loads(line)
    results = repeat(settings, once)
    shutil.rmtree(cat, ignore_errors=True)
    return results


def expiration(settings, cmds, where, work, db, resource):
    bench = os.path.join(EXAMPLES, "expire_bench")
    results = on_copies(settings, cmds, where, work, db,
                        lambda copy, _: [bench, "expire", copy, str(resource)])
    return Stat(r["seconds"] for r in results), results[0]


def dbbackup(settings, cmds, where, work, db):
    bench = os.path.join(EXAMPLES, "dbbackup_bench")
    return on_copies(settings, cmds, where, work, db, lambda copy, scratch: [bench, copy, scratch])


def ssd(settings):
    cmds = Commands()
    work = os.path.join(OUT, "tsm-ssd")
    os.makedirs(work, exist_ok=True)
    tree = data.kernel_tree(QUICK_SAMPLE if settings.quick else 1)
    nfiles = sum(len(fs) for _, _, fs in os.walk(tree))
    versions = 1_000_000 if settings.quick else 5_000_000
    db = os.path.join(data.DATA, f"catalog-{versions}.db")
    if not os.path.exists(db):
        run(cmds.note([os.path.join(EXAMPLES, "expire_bench"), "gen", db + ".tmp",
                       str(versions), "20"]))
        os.rename(db + ".tmp", db)
    doc = Document("tsm-ssd", "TSM SSD article: the catalog on the pool's disk or a fast one",
                   settings, "bench/run.sh tsm-ssd")
    res = {}
    for loc, where in LOCATIONS:
        res[loc, "backups"] = backups(settings, cmds, where, work, tree)
        for r in (1, 10):
            res[loc, "expire", r] = expiration(settings, cmds, where, work, db, r)
        res[loc, "dbbackup"] = dbbackup(settings, cmds, where, work, db)
        log(f"tsm-ssd {loc}: " + ", ".join(f"{k} {v.median:.2f} s"
                                           for k, v in res[loc, "backups"].items()))
    cases = list(res[LOCATIONS[0][0], "backups"])
    rows = [[c] + [res[loc, "backups"][c].fmt(2, " s") for loc, _ in LOCATIONS] +
            [f"{res[LOCATIONS[0][0], 'backups'][c].median / res[LOCATIONS[1][0], 'backups'][c].median:.2f}"]
            for c in cases]
    disk, fast = LOCATIONS[0][0], LOCATIONS[1][0]
    doc.text(f"""
## Backups

The Linux kernel's source files ({nfiles:,} files; one in {QUICK_SAMPLE} in --quick) backed up
to a `qsm server` on 127.0.0.1 whose SQLite catalog (WAL, synchronous = FULL) is either in
the server's directory on the same disk as the pool, or on a tmpfs ({TMPFS}). Incremental:
after a full backup, each run changes another 5% of the files (a line inserted at the start)
and runs `qsm backup` (the incremental). Dedup "0,1": `qsm backup --selective --dedup on`
into a fresh server (every chunk new); "100,2": the same again into that server (every chunk
already stored, each still looked up and referenced). A tmpfs ignores fsync, so it is a
faster stand-in than any SSD: the difference is an upper bound of what a fast catalog disk
can give.
""")
    doc.table(["case", disk, fast, "disk / tmpfs"], rows)
    doc.plot(plot.bars("Backups: catalog on the pool's disk or a tmpfs", "case", "seconds",
                       cases, [(loc, [(res[loc, "backups"][c].median, res[loc, "backups"][c].min,
                                      res[loc, "backups"][c].max) for c in cases])
                               for loc, _ in LOCATIONS]),
             "backup times by catalog location")
    first = res[disk, "expire", 1][1]
    rows = []
    for r in (1, 10):
        row = [f"{r}"]
        for loc, _ in LOCATIONS:
            st = res[loc, "expire", r][0]
            row += [st.fmt(2, " s"), f"{first['deleted'] / st.median * 60 / 1e6:.2f} M"]
        rows.append(row)
    doc.text(f"""
## Inventory expiration

A catalog of {versions:,} versions in 20 filespaces (`expire_bench gen`: five versions per
path, {first['deleted']:,} of them expirable under the default copy group), expired by the
server's engine with RESOURCE workers on a fresh copy of it in each run.
""")
    doc.table(["resource", f"{disk}: time", "deleted per minute",
               f"{fast}: time", "deleted per minute"], rows)
    doc.plot(plot.bars("Expiration: catalog on the pool's disk or a tmpfs", "resource",
                       "seconds", ["1", "10"],
                       [(loc, [(res[loc, "expire", r][0].median, res[loc, "expire", r][0].min,
                                res[loc, "expire", r][0].max) for r in (1, 10)])
                        for loc, _ in LOCATIONS]),
             "expiration time by workers and catalog location")
    rows = []
    measures = [("backup, idle", "idle_seconds"), ("backup, with a writer committing",
                                                   "busy_seconds"),
                ("restore (decompress, check, swap)", "restore_seconds")]
    for label, key in measures:
        rows.append([label] + [Stat(x[key] for x in res[loc, "dbbackup"]).fmt(2, " s")
                               for loc, _ in LOCATIONS])
    rows.append(["writer during the backup / alone"] + [
        f"{Stat(x['writer_per_s_during'] / max(1, x['writer_per_s_alone']) * 100 for x in res[loc, 'dbbackup']).median:.0f}%"
        for loc, _ in LOCATIONS])
    d0 = res[disk, "dbbackup"][0]
    doc.text(f"""
## Catalog backup

`qsm admin backup db`'s code (`dbbackup_bench`) on the same catalog
({d0['catalog_bytes'] / 1e6:.0f} MB): a consistent copy compressed into a QSM stream, idle
and while a writer commits versions into the catalog; then the restore `qsm server
restore-db` does.
""")
    doc.table(["measure", disk, fast], rows)
    doc.plot(plot.bars("Catalog backup and restore", "measure", "seconds",
                       [m for m, _ in measures],
                       [(loc, [(Stat(x[k] for x in res[loc, "dbbackup"]).median,
                                Stat(x[k] for x in res[loc, "dbbackup"]).min,
                                Stat(x[k] for x in res[loc, "dbbackup"]).max)
                               for _, k in measures]) for loc, _ in LOCATIONS]),
             "catalog backup and restore by catalog location")
    doc.write(f"""
- The pool is always on the disk (bench/out/suite); only the catalog moves. The disk is a
  virtual disk of a shared host, the tmpfs RAM ({TMPFS}).
- Each case: one untimed warm-up, then the timed runs; dedup and expiration runs each start
  from a fresh server or a fresh copy of the catalog.
""", cmds.seen)
