"""The benchmark data, made once under bench/out/suite/data and reused:

- the corpora of ../shared/corpus (Silesia and Canterbury), decompressed;
- the Linux kernel sources from Debian's linux-source package (fetched with apt-get from the
  package registry, nothing else): the tree of many small real files, whole or a sample
  of one file in N spread over it;
- large files of real content in three kinds, as the ADSM study's test files were: text (the
  kernel tarball's uncompressed stream), executables (the ELF files under /usr and the Rust
  toolchain, concatenated in path order) and already-compressed data (the kernel's .tar.xz,
  then zlib-compressed executables beyond its length);
- the TS7700 study's patterns: A00 (random bytes: nothing compresses) and RECS4 (four
  consecutive 32 KiB blocks from the middle of every corpus file of at least 1 MiB).
"""

import glob
import lzma
import os
import random
import shutil
import subprocess
import tarfile
import zlib

from common import CORPUS, OUT, log, mib

DATA = os.path.join(OUT, "data")
KINDS = ["text", "executables", "compressed"]
# --quick's sample of the kernel tree: one file in 16 (about 5,700 files, 90 MB).
QUICK_SAMPLE = 16


def _atomic(path, writer):
    """Runs WRITER(tmp) and renames tmp to PATH, so an interrupted run leaves nothing that
    looks finished."""
    if os.path.exists(path):
        return path
    tmp = path + ".tmp"
    if os.path.isdir(tmp):
        shutil.rmtree(tmp)
    elif os.path.exists(tmp):
        os.remove(tmp)
    writer(tmp)
    os.rename(tmp, path)
    return path


def corpus():
    """{name: path} of every corpus file, decompressed into DATA/corpus."""
    d = os.path.join(DATA, "corpus")
    os.makedirs(d, exist_ok=True)
    files = {}
    for xz in sorted(glob.glob(os.path.join(CORPUS, "*.xz"))):
        name = os.path.basename(xz)[:-3]

        def write(tmp, xz=xz):
            with lzma.open(xz) as src, open(tmp, "wb") as dst:
                shutil.copyfileobj(src, dst, mib(1))
        files[name] = _atomic(os.path.join(d, name), write)
    if not files:
        raise SystemExit(f"no corpus in {CORPUS} (set QSM_CORPUS)")
    return files


def kernel_tarball():
    """The newest linux-source-X.Y package's .tar.xz, fetched with apt-get download."""
    d = os.path.join(DATA, "kernel")
    os.makedirs(d, exist_ok=True)
    found = glob.glob(os.path.join(d, "linux-source-*.tar.xz"))
    if found:
        return found[0]
    pkg = _newest_source_package()
    if pkg is None:
        subprocess.run(["apt-get", "update", "-qq"], check=True)
        pkg = _newest_source_package()
    if pkg is None:
        raise SystemExit("no linux-source package in the Debian archive")
    return _unpack_deb(d, pkg)


def _newest_source_package():
    names = subprocess.run(["apt-cache", "search", "--names-only", r"^linux-source-[0-9.]*$"],
                           capture_output=True, text=True).stdout.split()
    pkgs = sorted((n for n in names if n.startswith("linux-source-")),
                  key=lambda n: [int(x) for x in n.split("-")[-1].split(".") if x.isdigit()])
    return pkgs[-1] if pkgs else None


def _unpack_deb(d, pkg):
    log(f"fetching {pkg} from the Debian archive")
    for old in glob.glob(os.path.join(d, "*.deb")):
        os.remove(old)
    subprocess.run(["apt-get", "download", "-q", pkg], cwd=d, check=True,
                   capture_output=True)
    debs = glob.glob(os.path.join(d, pkg + "_*.deb"))
    if not debs:
        raise SystemExit(f"apt-get download {pkg} left no {pkg}_*.deb in {d}")
    deb = debs[0]
    fsys = subprocess.Popen(["dpkg-deb", "--fsys-tarfile", deb], stdout=subprocess.PIPE)
    subprocess.run(["tar", "-x", "-C", d, "--wildcards", "--strip-components=3",
                    "./usr/src/linux-source-*.tar.xz"], stdin=fsys.stdout, check=True)
    fsys.wait()
    os.remove(deb)
    return glob.glob(os.path.join(d, "linux-source-*.tar.xz"))[0]


def kernel_tree(every=1):
    """The kernel sources unpacked: all of them, or one file in EVERY (chosen by a hash of its
    path, so the sample spreads over the whole tree and is the same on every machine)."""
    tarball = kernel_tarball()
    path = os.path.join(DATA, "linux" if every == 1 else f"linux-1in{every}")

    def write(tmp):
        log(f"unpacking {'all' if every == 1 else f'one in {every}'} of the kernel's files")
        os.makedirs(tmp)
        if every == 1:
            subprocess.run(["tar", "-xJf", tarball, "-C", tmp, "--no-same-owner"], check=True)
            return
        with tarfile.open(tarball, "r|xz") as tar:
            for m in tar:
                if m.isfile() and zlib.crc32(m.name.encode()) % every == 0:
                    tar.extract(m, tmp, filter="data")
    return _atomic(path, write)


def _text_stream():
    """The kernel tarball, uncompressed: real source text (with tar headers)."""
    return lzma.open(kernel_tarball())


def _elf_files():
    roots = ["/usr/bin", "/usr/sbin", "/usr/lib", "/usr/libexec",
             os.path.expanduser("~/.rustup/toolchains")]
    for root in roots:
        for d, dirs, fs in os.walk(root):
            dirs.sort()
            for f in sorted(fs):
                p = os.path.join(d, f)
                if os.path.islink(p) or not os.path.isfile(p):
                    continue
                try:
                    with open(p, "rb") as h:
                        if h.read(4) == b"\x7fELF":
                            yield p
                except OSError:
                    continue


class _ElfStream:
    def __init__(self):
        self.files = _elf_files()
        self.current = None

    def read(self, n):
        while True:
            if self.current is None:
                path = next(self.files, None)
                if path is None:
                    return b""
                self.current = open(path, "rb")
            b = self.current.read(n)
            if b:
                return b
            self.current.close()
            self.current = None


class _CompressedStream:
    """The kernel's .tar.xz, then zlib-compressed executables (level 6)."""

    def __init__(self):
        self.xz = open(kernel_tarball(), "rb")
        self.elf = None
        self.z = zlib.compressobj(6)
        self.pending = b""

    def read(self, n):
        if self.elf is None:
            b = self.xz.read(n)
            if b:
                return b
            self.elf = _ElfStream()
        while len(self.pending) < n:
            raw = self.elf.read(mib(1))
            if not raw:
                self.pending += self.z.flush()
                break
            self.pending += self.z.compress(raw)
        b, self.pending = self.pending[:n], self.pending[n:]
        return b


def _stream(kind):
    return {"text": _text_stream, "executables": _ElfStream,
            "compressed": _CompressedStream}[kind]()


def large_file(kind, size):
    """A file of SIZE bytes of KIND (text, executables, compressed), the stream's first SIZE
    bytes."""
    d = os.path.join(DATA, "large")
    os.makedirs(d, exist_ok=True)

    def write(tmp):
        log(f"making {size >> 20} MiB of {kind}")
        _copy(_stream(kind), tmp, size, kind)
    return _atomic(os.path.join(d, f"{kind}-{size}"), write)


def _copy(src, path, size, kind):
    """The next SIZE bytes of the stream SRC into a new file PATH."""
    left = size
    with open(path, "wb") as f:
        while left:
            b = src.read(min(left, mib(4)))
            if not b:
                raise SystemExit(f"not enough {kind} on this machine for {size} bytes")
            f.write(b)
            left -= len(b)


def files_of(kind, size, count, where):
    """A directory of COUNT files of SIZE bytes of KIND, consecutive slices of one stream, so
    every file has its own content."""
    path = os.path.join(where, f"{kind}-{size}x{count}")

    def write(tmp):
        os.makedirs(tmp)
        src = _stream(kind)
        for i in range(count):
            _copy(src, os.path.join(tmp, f"f{i:04}"), size, kind)
    return _atomic(path, write)


def a00(size):
    """The A00 pattern: random bytes (seeded, so every run has the same)."""
    d = os.path.join(DATA, "patterns")
    os.makedirs(d, exist_ok=True)

    def write(tmp):
        rng = random.Random(700)
        with open(tmp, "wb") as f:
            left = size
            while left:
                n = min(left, mib(4))
                f.write(rng.randbytes(n))
                left -= n
    return _atomic(os.path.join(d, f"A00-{size}"), write)


def recs4_pattern():
    """RECS4: four consecutive 32 KiB blocks from the middle of each corpus file of at least
    1 MiB, in name order."""
    d = os.path.join(DATA, "patterns")
    os.makedirs(d, exist_ok=True)

    def write(tmp):
        with open(tmp, "wb") as out:
            for name, path in sorted(corpus().items()):
                size = os.path.getsize(path)
                if size < mib(1):
                    continue
                with open(path, "rb") as f:
                    f.seek(size // 2)
                    out.write(f.read(4 * 32768))
    return _atomic(os.path.join(d, "RECS4"), write)


def recs4_volume(size):
    """A volume of SIZE bytes: the RECS4 pattern repeated, as the study's jobs wrote it."""
    d = os.path.join(DATA, "patterns")

    def write(tmp):
        with open(recs4_pattern(), "rb") as f:
            pattern = f.read()
        with open(tmp, "wb") as f:
            left = size
            while left:
                f.write(pattern[:left])
                left -= min(left, len(pattern))
    return _atomic(os.path.join(d, f"RECS4-{size}"), write)


def change_files(root, fraction, seed):
    """Changes FRACTION of the files under ROOT (chosen by SEED): a line inserted at the start,
    as an edit would. Returns {path: original bytes}, for restore_files."""
    paths = sorted(os.path.join(d, f) for d, _, fs in os.walk(root) for f in fs)
    rng = random.Random(seed)
    chosen = rng.sample(paths, max(1, int(len(paths) * fraction)))
    saved = {}
    for p in chosen:
        with open(p, "rb") as f:
            saved[p] = f.read()
        with open(p, "wb") as f:
            f.write(b"/* changed by the benchmark, run %d */\n" % seed + saved[p])
    return saved


def restore_files(saved):
    for p, content in saved.items():
        with open(p, "wb") as f:
            f.write(content)
