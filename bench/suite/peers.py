"""QSM against restic and BorgBackup (Debian's packages), and rustic and bupstash where they
installed from crates.io, on the same data in the same run: first backup, incremental after
changing 5% of the files, restore, repository size, CPU time and peak memory. Each tool at its
defaults and at a comparable compression (zstd level 3, lz4)."""

import os
import shutil

import data
from data import QUICK_SAMPLE
import plot
from common import (OUT, QSM, Commands, Document, Stat, copy_floor_text, disk_usage, du,
                    fresh, log, restore_target, run, same_tree)

PASSWORD = "bench-password"


class Tool:
    """One tool in one configuration: how to init a repository, back up, restore."""

    def __init__(self, tool, config, note):
        self.tool, self.config, self.note = tool, config, note

    @property
    def name(self):
        return f"{self.tool} {self.config}"

    def available(self):
        return shutil.which(self.tool) is not None or self.tool == "qsm"


class Qsm(Tool):
    def __init__(self, config, args, note):
        super().__init__("qsm", config, note)
        self.args = args

    def env(self, repo):
        pw = os.path.join(os.path.dirname(repo), "passphrase")
        with open(os.open(pw, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as f:
            f.write(PASSWORD + "\n")
        os.chmod(pw, 0o600)
        return {"QSM_HOME": repo, "QSM_KEY_FILE": repo + ".key", "QSM_PASSPHRASE_FILE": pw,
                "HOME": os.path.dirname(repo)}

    def init(self, repo, cmds):
        os.makedirs(repo)

    def backup(self, repo, src, cmds, n):
        return [QSM, "backup", *self.args, src]

    def restore(self, repo, src, target):
        return [QSM, "restore", src, "--to", target], target


class Restic(Tool):
    def __init__(self, config, args, note):
        super().__init__("restic", config, note)
        self.args = args

    def env(self, repo):
        return {"RESTIC_PASSWORD": PASSWORD, "RESTIC_CACHE_DIR": repo + ".cache"}

    def init(self, repo, cmds):
        run(cmds.note(["restic", "init", "-q", "-r", repo]), env=self.env(repo))

    def backup(self, repo, src, cmds, n):
        return ["restic", "-q", "-r", repo, "backup", *self.args, src]

    def restore(self, repo, src, target):
        return ["restic", "-q", "-r", repo, "restore", "latest", "--target", target], \
            target + src


class Rustic(Tool):
    def __init__(self, config, args, note):
        super().__init__("rustic", config, note)
        self.args = args

    def env(self, repo):
        return {"RUSTIC_PASSWORD": PASSWORD, "RUSTIC_REPOSITORY": repo,
                "RUSTIC_CACHE_DIR": repo + ".cache", "HOME": os.path.dirname(repo)}

    def init(self, repo, cmds):
        run(cmds.note(["rustic", "init"]), env=self.env(repo))

    def backup(self, repo, src, cmds, n):
        return ["rustic", "backup", *self.args, src]

    def restore(self, repo, src, target):
        return ["rustic", "restore", "latest", target], target + src


class Borg(Tool):
    def __init__(self, config, args, note):
        super().__init__("borg", config, note)
        self.args = args

    def env(self, repo):
        return {"BORG_PASSPHRASE": PASSWORD, "BORG_CACHE_DIR": repo + ".cache",
                "BORG_CONFIG_DIR": repo + ".config", "BORG_BASE_DIR": os.path.dirname(repo),
                "BORG_RELOCATED_REPO_ACCESS_IS_OK": "yes"}

    def init(self, repo, cmds):
        run(cmds.note(["borg", "init", "-e", "repokey-blake2", repo]), env=self.env(repo))

    def backup(self, repo, src, cmds, n):
        return ["borg", "create", *self.args, f"{repo}::b{n}", src]

    def restore(self, repo, src, target):
        os.makedirs(target, exist_ok=True)
        return ["borg", "extract", f"{repo}::b2"], target + src


class Bupstash(Tool):
    def __init__(self, config, args, note):
        super().__init__("bupstash", config, note)
        self.args = args

    def env(self, repo):
        return {"BUPSTASH_REPOSITORY": repo, "BUPSTASH_KEY": repo + ".key",
                "HOME": os.path.dirname(repo), "XDG_CACHE_HOME": repo + ".cache"}

    def init(self, repo, cmds):
        run(cmds.note(["bupstash", "init"]), env=self.env(repo))
        run(cmds.note(["bupstash", "new-key", "-o", repo + ".key"]), env=self.env(repo))

    def backup(self, repo, src, cmds, n):
        return ["bupstash", "put", *self.args, f"run=b{n}", src]

    def restore(self, repo, src, target):
        os.makedirs(target, exist_ok=True)
        return ["bupstash", "restore", "--into", target, "run=b2"], target


TOOLS = [
    Qsm("default", [], "compression auto (zstd-3, incompressible quanta raw), no dedup, "
        "no encryption: `qsm backup DIR` into the embedded store"),
    Qsm("dedup+encryption", ["--dedup", "on", "--encryption", "on"],
        "zstd-3, content-defined chunks deduplicated, every quantum encrypted (AES-256-GCM)"),
    Qsm("lz4", ["--compression", "lz4"], "lz4, no dedup, no encryption"),
    Restic("default", [], "encrypted, deduplicated, compression auto (zstd, repository v2)"),
    Rustic("default", [], "encrypted, deduplicated, zstd (its default level)"),
    Borg("default", [], "repokey-blake2 encryption, deduplicated, compression lz4 (its default)"),
    Borg("zstd,3", ["--compression", "zstd,3"], "repokey-blake2, deduplicated, zstd level 3"),
    Bupstash("default", [], "encrypted, deduplicated, compression zstd:3 (its default)"),
]


def _cycle(tool, src, work, cmds, seed):
    """One run: a fresh repository, the first backup, 5% of the files changed, the
    incremental, the repository's size, a restore (checked). The change is undone after."""
    base = fresh(os.path.join(work, tool.tool))
    repo = os.path.join(base, "repo")
    env = tool.env(repo)
    tool.init(repo, cmds)
    first = run(cmds.note(tool.backup(repo, src, cmds, 1)), env=env)
    saved = data.change_files(src, 0.05, seed)
    try:
        incr = run(cmds.note(tool.backup(repo, src, cmds, 2)), env=env)
        size = disk_usage(repo)
        target = restore_target(tool.tool)
        argv, where = tool.restore(repo, src, target)
        # Borg extracts into its working directory.
        rest = run(cmds.note(argv), env=env, cwd=target if tool.tool == "borg" else None)
        if not same_tree(src, where):
            raise SystemExit(f"{tool.name}: the restore in {where} differs from {src}")
    finally:
        data.restore_files(saved)
    shutil.rmtree(base, ignore_errors=True)
    shutil.rmtree(target, ignore_errors=True)
    return {"first": first, "incremental": incr, "restore": rest, "size": size}


def peers(settings):
    cmds = Commands()
    work = os.path.join(OUT, "peers")
    src = data.kernel_tree(QUICK_SAMPLE if settings.quick else 1)
    nbytes = du(src)
    nfiles = sum(len(fs) for _, _, fs in os.walk(src))
    tools = [t for t in TOOLS if t.available()]
    missing = sorted({t.tool for t in TOOLS if not t.available()})
    # Round robin: a warm-up round of every tool, then the timed rounds, each tool once per
    # round, so a noisy neighbour's slow minute hits all tools alike.
    for t in tools:
        _cycle(t, src, work, cmds, 100)
    res = {t.name: [] for t in tools}
    for r in range(settings.runs):
        for t in tools:
            res[t.name].append(_cycle(t, src, work, cmds, r + 1))
            c = res[t.name][-1]
            log(f"peers round {r + 1} {t.name}: first {c['first'].wall:.2f} s, incremental "
                f"{c['incremental'].wall:.2f} s, restore {c['restore'].wall:.2f} s, "
                f"{c['size'] / 1e6:.0f} MB")
    versions = {t.tool: _version(t.tool) for t in tools}
    doc = Document("peers", "QSM against restic, Borg, rustic and bupstash", settings,
                   "bench/run.sh peers")
    doc.text(f"""
The data: the Linux kernel's source files from Debian's linux-source package ({nfiles:,}
files, {nbytes / 1e6:.0f} MB; one file in {QUICK_SAMPLE} spread over the tree in --quick, all of them
in --full), on the same disk as the repositories, in the page cache. Every run starts from
an empty repository on this disk: the first backup, then 5% of the files changed (a line
inserted at the start of each) and the incremental backup, then a restore of the latest
backup into an empty directory, compared with the source. {copy_floor_text(src)} Times are wall seconds of the
tool's process; CPU is its user+sys; memory its peak resident set; the repository's size is
what it occupies on disk after both backups (`du`).

Tools and configurations:

""" + "\n".join(f"- **{t.name}** ({versions[t.tool]}): {t.note}" for t in tools) + (
        f"\n- not installed, so not measured: {', '.join(missing)}" if missing else ""))
    for phase, title in (("first", "First backup"), ("incremental", "Incremental, 5% changed"),
                         ("restore", "Restore")):
        rows = []
        for t in tools:
            runs = [c[phase] for c in res[t.name]]
            wall = Stat(x.wall for x in runs)
            rows.append([t.name, wall.fmt(2, " s"), f"{nbytes / 1e6 / wall.median:.0f}",
                         f"{Stat(x.cpu for x in runs).median:.2f} s",
                         f"{Stat(x.rss_mb for x in runs).median:.0f} MB"])
        doc.text(f"## {title}")
        doc.table(["tool", "time", "MB/s", "CPU", "peak memory"], rows)
        doc.plot(plot.bars(f"{title}: time", "tool", "seconds", [t.name for t in tools],
                           [("wall", [(Stat(c[phase].wall for c in res[t.name]).median,
                                       Stat(c[phase].wall for c in res[t.name]).min,
                                       Stat(c[phase].wall for c in res[t.name]).max)
                                      for t in tools]),
                            ("CPU", [Stat(c[phase].cpu for c in res[t.name]).median
                                     for t in tools])]),
                 f"{title}: wall and CPU seconds per tool")
    rows = [[t.name, f"{Stat(c['size'] for c in res[t.name]).median / 1e6:.1f} MB",
             f"{nbytes / Stat(c['size'] for c in res[t.name]).median:.2f}"] for t in tools]
    doc.text("## Repository size after both backups")
    doc.table(["tool", "size", "source / size"], rows)
    doc.plot(plot.bars("Repository size after both backups", "tool", "MB",
                       [t.name for t in tools],
                       [("size", [Stat(c["size"] for c in res[t.name]).median / 1e6
                                  for t in tools])]),
             "repository size per tool")
    doc.text("## QSM against each peer (QSM time / peer time, QSM size / peer size; below 1 "
             "QSM is faster or smaller)")
    def median(name, measure):
        return Stat(measure(c) for c in res[name]).median

    measures = [lambda c, p=phase: c[p].wall for phase in ("first", "incremental", "restore")]
    measures.append(lambda c: c["size"])
    rows = []
    for t in tools:
        if t.tool == "qsm":
            continue
        rows.append([t.name] + [
            f"{median('qsm default', m) / median(t.name, m):.2f} / "
            f"{median('qsm dedup+encryption', m) / median(t.name, m):.2f}" for m in measures])
    doc.text("Each cell: qsm default / qsm dedup+encryption (the peers' own features: every "
             "peer deduplicates and encrypts).")
    doc.table(["peer", "first backup", "incremental", "restore", "repository size"], rows)
    doc.write("""
- One warm-up round (every tool once), then the timed rounds; within a round the tools run
  one after another in the order above, so all see the same machine.
- restic and Borg are Debian's packages (apt-get); rustic and bupstash are built from
  crates.io with `cargo install --locked` by bench/run.sh where they build.
""", cmds.seen)


def _version(tool):
    argv = {"qsm": [QSM, "--version"], "restic": ["restic", "version"],
            "borg": ["borg", "--version"], "rustic": ["rustic", "--version"],
            "bupstash": ["bupstash", "version"]}[tool]
    r = run(argv, check=False)
    return r.stdout.strip().split("\n")[0] or "version unknown"
