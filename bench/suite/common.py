"""Shared pieces of the benchmark suite: running and timing commands, repeated measurements
(median with min and max after a warm-up), the machine's description, Markdown tables and
the documents under docs/benchmarks/."""

import os
import platform
import shutil
import statistics
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
QSM = os.path.join(REPO, "target", "release", "qsm")
EXAMPLES = os.path.join(REPO, "target", "release", "examples")
OUT = os.path.join(REPO, "bench", "out", "suite")
DOCS = os.path.join(REPO, "docs", "benchmarks")
CORPUS = os.environ.get("QSM_CORPUS", os.path.join(os.path.dirname(REPO), "shared", "corpus"))
GNU_TIME = "/usr/bin/time"
# A tmpfs, the stand-in for a separate fast disk (an SSD) where an experiment asks for one.
TMPFS = "/dev/shm"


def log(*args):
    print(*args, file=sys.stderr, flush=True)


class Run:
    """One finished command: wall seconds, CPU seconds (user + sys of the process and the
    children it waited for) and peak resident memory in MB (of the largest of them)."""

    def __init__(self, wall, cpu, rss_mb, stdout):
        self.wall, self.cpu, self.rss_mb, self.stdout = wall, cpu, rss_mb, stdout


class CommandFailed(Exception):
    pass


def run(args, env=None, cwd=None, stdout_to=None, check=True, stdin=None):
    """Runs ARGS and measures it with wait4(2): its own rusage, not the whole suite's. The
    peak memory comes from GNU time (`/usr/bin/time -f %M`): a child forked from this
    process reports this process's own peak as its ru_maxrss, exec or not."""
    out = open(stdout_to, "wb") if stdout_to else subprocess.PIPE
    full_env = dict(os.environ, **(env or {}))
    rss_file = os.path.join(OUT, f".rss-{os.getpid()}")
    os.makedirs(OUT, exist_ok=True)
    started = time.perf_counter()
    p = subprocess.Popen([GNU_TIME, "-q", "-f", "%M", "-o", rss_file, *args], env=full_env,
                         cwd=cwd, stdout=out, stderr=subprocess.PIPE,
                         stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL)
    if stdin is not None:
        p.stdin.write(stdin.encode())
        p.stdin.close()
    # Read the pipes before reaping, or a chatty command blocks on a full pipe.
    stdout = p.stdout.read() if out is subprocess.PIPE else b""
    stderr = p.stderr.read()
    _, status, usage = os.wait4(p.pid, 0)
    wall = time.perf_counter() - started
    p.returncode = os.waitstatus_to_exitcode(status)
    if stdout_to:
        out.close()
    if check and p.returncode != 0:
        raise CommandFailed(f"{' '.join(map(str, args))} exited {p.returncode}: "
                            f"{stderr.decode(errors='replace').strip()[-600:]}")
    try:
        with open(rss_file) as f:
            rss_kb = int(f.read().split()[-1])
    except (OSError, ValueError, IndexError):
        rss_kb = 0
    return Run(wall, usage.ru_utime + usage.ru_stime, rss_kb / 1024,
               stdout.decode(errors="replace"))


class Stat:
    """A measurement repeated: median, min and max of its values."""

    def __init__(self, values):
        self.values = list(values)
        self.median = statistics.median(self.values)
        self.min = min(self.values)
        self.max = max(self.values)

    def fmt(self, digits=2, unit=""):
        f = f"{{:.{digits}f}}"
        return f"{f.format(self.median)}{unit} ({f.format(self.min)}-{f.format(self.max)})"



class Settings:
    """What the command line chose: quick or full sizes, and how many timed runs."""

    def __init__(self, quick, runs):
        self.quick, self.runs = quick, runs


def repeat(settings, measure, warmup=True):
    """Calls MEASURE() once untimed (the warm-up: page cache, binaries, a server's caches)
    unless WARMUP is false, then settings.runs times; returns the list of their results."""
    if warmup:
        measure()
    return [measure() for _ in range(settings.runs)]


def machine():
    """CPU, cores, memory, disk and kernel, as one Markdown list."""
    cpu = platform.processor() or "unknown CPU"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    mem_gb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    disk = shutil.disk_usage(OUT if os.path.isdir(OUT) else REPO)
    dev = subprocess.run(["df", "--output=source,fstype", OUT if os.path.isdir(OUT) else REPO],
                         capture_output=True, text=True).stdout.split("\n")[1:2]
    rev = subprocess.run(["git", "-C", REPO, "rev-parse", "--short", "HEAD"],
                         capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run(["git", "-C", REPO, "status", "--porcelain", "--untracked-files=no"],
                           capture_output=True, text=True).stdout.strip()
    return "\n".join([
        f"- **CPU**: {cpu}, {os.cpu_count()} cores (a shared host: a neighbour can take "
        "part of a core, so absolute figures drift; ratios measured in one run hold)",
        f"- **memory**: {mem_gb:.0f} GiB",
        f"- **disk**: {' '.join(dev[0].split()) if dev else '?'}, "
        f"{disk.total / 1e9:.0f} GB ({disk.free / 1e9:.0f} GB free); "
        f"tmpfs at {TMPFS} where an experiment says so",
        f"- **kernel**: {platform.system()} {platform.release()}",
        f"- **QSM**: {rev}{' (with uncommitted changes)' if dirty else ''}, release build",
        f"- **date**: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}",
    ])


def table(header, rows, align=None):
    """A Markdown table; ALIGN is a string of 'l'/'r' per column (default: first left, rest
    right)."""
    align = align or "l" + "r" * (len(header) - 1)
    lines = ["| " + " | ".join(header) + " |",
             "|" + "|".join("---" if a == "l" else "---:" for a in align) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


class Document:
    """docs/benchmarks/NAME.md: a title, the machine, the method, sections of tables each
    with its plot (NAME-K.svg), and the commands that reproduce it."""

    def __init__(self, name, title, settings, command):
        # --full writes NAME-full.md beside --quick's NAME.md, so both can be kept.
        name = name if settings.quick else f"{name}-full"
        self.name, self.title, self.settings = name, title, settings
        self.command = command
        self.parts = []
        self.plots = 0
        os.makedirs(DOCS, exist_ok=True)

    def text(self, text):
        self.parts.append(text.strip("\n"))

    def table(self, header, rows, align=None):
        self.parts.append(table(header, rows, align))

    def plot(self, svg_text, caption):
        self.plots += 1
        file = f"{self.name}-{self.plots}.svg"
        with open(os.path.join(DOCS, file), "w") as f:
            f.write(svg_text)
        self.parts.append(f"![{caption}]({file})")

    def write(self, method, commands):
        mode = "--quick" if self.settings.quick else "--full"
        head = [
            f"# {self.title}",
            "",
            f"Made by `{self.command}` ({mode}); every timed figure is the median of "
            f"{self.settings.runs} runs after an untimed warm-up, with the minimum and "
            "maximum of those runs in brackets (median (min-max)).",
            "",
            "## Machine",
            "",
            machine(),
            "",
            "## Method",
            "",
            method.strip("\n"),
            "",
        ]
        tail = ["", "## Commands", "", "Each measured command, as run (paths shortened to "
                "`$OUT`, the scratch directory `bench/out/suite`):", "", "```"]
        tail += [c.replace(OUT, "$OUT").replace(REPO + "/", "") for c in commands]
        tail += ["```", ""]
        path = os.path.join(DOCS, f"{self.name}.md")
        with open(path, "w") as f:
            f.write("\n".join(head) + "\n" + "\n\n".join(self.parts) + "\n" + "\n".join(tail))
        log(f"wrote {path}")
        return path


class Commands:
    """The commands an experiment ran, each recorded once in its shape (the first time), for
    the document's Commands section."""

    def __init__(self):
        self.seen = []

    def note(self, args, env=None, shape=None):
        """Records ARGS (or SHAPE, a description with placeholders where runs differ, e.g.
        the files of a cell) and returns ARGS."""
        shown = shape or " ".join(_quote(str(a)) for a in args)
        if env:
            shown = " ".join(f"{k}={_quote(str(v))}" for k, v in env.items()) + " " + shown
        if shown not in self.seen:
            self.seen.append(shown)
        return args


def _quote(s):
    return s if s and all(c.isalnum() or c in "-_./:=,+@%" for c in s) else "'" + s + "'"


def du(path):
    """Bytes of every file under PATH (apparent sizes, as `du -sb`)."""
    if os.path.isfile(path):
        return os.path.getsize(path)
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path)
               for f in fs if not os.path.islink(os.path.join(d, f)))


def disk_usage(path):
    """Bytes allocated on disk under PATH (as `du -s`), what a repository really costs."""
    r = subprocess.run(["du", "-sk", path], capture_output=True, text=True)
    return int(r.stdout.split()[0]) * 1024 if r.returncode == 0 else du(path)


def same_tree(a, b):
    return subprocess.run(["diff", "-r", "-q", a, b], capture_output=True).returncode == 0


def fresh(path):
    shutil.rmtree(path, ignore_errors=True)
    os.makedirs(path)
    return path


def restore_target(name):
    """Where restores go: a tmpfs. On this project's machines creating a file on the ext4 disk
    costs about a millisecond of kernel time, which makes every tool's small-file restore
    take the same time; the copy floor (copy_floor) reports that cost beside the results."""
    path = os.path.join(TMPFS, f"qsm-bench-{name}")
    shutil.rmtree(path, ignore_errors=True)
    return path


def copy_floor(src, runs=3):
    """`cp -r SRC` into the disk and into the tmpfs, median seconds of RUNS each: what writing
    the tree alone costs at each place."""
    out = {}
    for where in (OUT, TMPFS):
        target = os.path.join(where, "qsm-bench-copy")
        times = []
        for _ in range(runs):
            shutil.rmtree(target, ignore_errors=True)
            subprocess.run(["sync"])
            times.append(run(["cp", "-r", src, target]).wall)
        shutil.rmtree(target, ignore_errors=True)
        out["disk" if where == OUT else "tmpfs"] = Stat(times)
    return out


def copy_floor_text(src):
    floor = copy_floor(src)
    return (f"Restores are written to a tmpfs ({TMPFS}): `cp -r` of the same tree takes "
            f"{floor['disk'].fmt(2, ' s')} to this machine's disk, almost all of it kernel time "
            f"creating files, and {floor['tmpfs'].fmt(2, ' s')} to the tmpfs; on the disk "
            "every tool's restore would take about the disk's figure.")


def mib(n):
    return n * 1024 * 1024
