#!/usr/bin/env python3
"""bench/load.py: many concurrent clients against one QSM server and against two servers
sharing one catalog and pool, with expiration running, on SQLite and on PostgreSQL.

    bench/load.py [--clients 1,8,32,64] [--files 400] [--file-kib 80]
                  [--catalogs sqlite,postgres] [--pools dir,s3] [--servers 1,2]
                  [--repeat 3] [--out bench/out/load]

Each client is a real `qsm backup` process of its own node, backing up a distinct tree
(`--files` files of `--file-kib` KiB on average, slices of the Silesia corpus of
`../shared/corpus/` taken at different offsets for each client: real text, executables,
databases and images, compressible about 3:1 as a whole) with the default compression, all
started at once. Clients are spread round-robin over the servers;
with two servers each client is given both addresses (its own first). While they run:
`qsm admin expire inventory` loops on the first server, and a probe times a small request
(`qsm admin query session` over the local socket) every 100 ms: its p50/p99 is the
request latency under load, including the probe's own process start (~10 ms, measured idle
first and reported). Afterwards every client's tree is restored and compared with `diff -r`:
a version lost or corrupt counts as an error.

Reported per cell: wall time, aggregate throughput (MB of original data / wall), median and
minimum per-client throughput, probe latency p50/p99, server CPU (user+sys of all server
processes, and as a share of the machine's cores), the CPU of the storage back ends
(PostgreSQL's processes, the S3 test server), peak server RSS, failed clients and failed
restores; the clients' own CPU is the rest of the machine. Each cell runs `--repeat` times
from scratch (new catalog, pool and servers); the table shows the run of median aggregate
throughput with the minimum and maximum of all runs, and failures summed over all runs. Writes OUT/load.md and OUT/load.json; prints the table.

PostgreSQL: the one on 127.0.0.1:5432 (scripts/ensure-postgres.sh starts or installs it), a
fresh database `qsm_bench_load` per cell. Pools: a directory (`dir`, shared by both servers
of a two-server cell), or a bucket (`s3`) of the S3 test server (s3s-fs, the
`s3-test-server` example of qsm-pool-s3) started per cell on 127.0.0.1, its objects on the
same disk. Two servers need the PostgreSQL catalog; SQLite cells run one.
"""

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import threading
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
QSM = os.path.join(REPO, "target", "release", "qsm")
S3_SERVER = os.path.join(REPO, "target", "release", "examples", "s3-test-server")
PG = "postgres://postgres@127.0.0.1:5432"
PASSWORD = "load-password"
CORPUS = os.environ.get("QSM_CORPUS", os.path.join(os.path.dirname(REPO), "shared", "corpus"))
SILESIA = ["dickens", "mozilla", "mr", "nci", "ooffice", "osdb", "reymont", "samba", "sao",
           "webster", "x-ray", "xml"]


def corpus_mix(out):
    """The Silesia files of the corpus, decompressed and concatenated once (cached in OUT)."""
    import lzma
    path = os.path.join(out, "silesia.mix")
    if os.path.exists(path):
        with open(path, "rb") as f:
            return f.read()
    names = [n for n in SILESIA if os.path.exists(os.path.join(CORPUS, n + ".xz"))]
    if not names:
        raise SystemExit(f"no Silesia files in {CORPUS}")
    parts = []
    for n in names:
        with lzma.open(os.path.join(CORPUS, n + ".xz")) as f:
            parts.append(f.read())
    mix = b"".join(parts)
    with open(path + ".tmp", "wb") as f:
        f.write(mix)
    os.rename(path + ".tmp", path)
    return mix


def make_tree(root, seed, files, kib, mix):
    """`files` files of `kib` KiB on average (half to one and a half times), each a slice of
    the corpus mix at an offset drawn per seed, so every client's tree is different."""
    if os.path.isdir(root):
        return
    rng = random.Random(seed)
    tmp = root + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    for i in range(files):
        d = os.path.join(tmp, f"d{i % 10}")
        os.makedirs(d, exist_ok=True)
        size = int(kib * 1024 * rng.uniform(0.5, 1.5))
        at = rng.randrange(0, len(mix) - size)
        with open(os.path.join(d, f"f{i}"), "wb") as f:
            f.write(mix[at:at + size])
    os.rename(tmp, root)


def tree_bytes(root):
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(root) for f in fs)


def proc_cpu(pid):
    """user+sys seconds of a process."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / tick


def backends_cpu(s3):
    """user+sys seconds of the storage back ends: every PostgreSQL process (with its reaped
    children's, so backends that ended count) and the S3 test server."""
    total = 0.0
    tick = os.sysconf("SC_CLK_TCK")
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/stat") as f:
                text = f.read()
        except OSError:
            continue
        comm = text[text.index("(") + 1:text.rindex(")")]
        fields = text.rsplit(")", 1)[1].split()
        if comm == "postgres" or (s3 is not None and int(pid) == s3.proc.pid):
            total += sum(int(x) for x in fields[11:15]) / tick
    return total


def proc_hwm_mb(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return 0.0


class S3:
    """The S3 test server over ROOT, with one bucket `load`."""

    def __init__(self, root):
        os.makedirs(root, exist_ok=True)
        self.log = open(root + ".log", "w")
        self.proc = subprocess.Popen(
            [S3_SERVER, "--root", root, "--access-key", "load-key", "--secret-key",
             "load-secret", "--bucket", "load"], stdout=subprocess.PIPE, stderr=self.log,
            text=True)
        first = self.proc.stdout.readline()
        if "listening on" not in first:
            raise SystemExit(f"the S3 test server did not start: see {root}.log")
        self.endpoint = first.split()[-1]

    def settings(self):
        return (f'[s3]\nendpoint = "{self.endpoint}"\nallow_http = true\nbucket = "load"\n'
                f'prefix = "qsm"\nregion = "us-east-1"\naccess_key = "load-key"\n'
                f'secret_key = "load-secret"\n')

    def stop(self):
        self.proc.kill()
        self.proc.wait()


class Server:
    def __init__(self, data, pool, catalog):
        """`pool`: a directory, or an S3 server whose bucket holds the pool."""
        os.makedirs(data, mode=0o700, exist_ok=True)
        self.data = data
        args = [QSM, "server", "--data-dir", data, "--listen", "127.0.0.1:0", "--plaintext",
                "--max-sessions", "512"]
        if isinstance(pool, S3):
            with open(os.path.join(data, "server.toml"), "w") as f:
                f.write(pool.settings())
        else:
            args += ["--pool", pool]
        if catalog:
            args += ["--catalog", catalog]
        self.log = open(os.path.join(data, "server.log"), "w")
        self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=self.log, text=True)
        first = self.proc.stdout.readline()
        if not first:
            raise SystemExit(f"the server in {data} did not start: see {data}/server.log")
        self.url = first.strip().rsplit(" ", 1)[-1]
        threading.Thread(target=self.proc.stdout.read, daemon=True).start()
        self.socket = "unix:" + os.path.join(data, "qsm.sock")

    def admin(self, *args, stdin=None):
        return subprocess.run([QSM, "admin", "--server", self.socket, *args], input=stdin,
                              capture_output=True, text=True)

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def percentile(values, p):
    if not values:
        return float("nan")
    v = sorted(values)
    return v[min(len(v) - 1, int(round(p / 100 * (len(v) - 1))))]


def probe_once(server):
    t = time.perf_counter()
    server.admin("query", "session")
    return (time.perf_counter() - t) * 1000


def run_cell(out, catalog_kind, pool_kind, nservers, nclients, trees, pwfile, compression=None,
             verify=True):
    """One cell: servers, NCLIENTS concurrent backups (with `--compression COMPRESSION` when
    given), and, when VERIFY, every client's restore compared with its tree."""
    cell = os.path.join(out, f"{catalog_kind}-{pool_kind}-{nservers}s-{nclients}c")
    shutil.rmtree(cell, ignore_errors=True)
    os.makedirs(cell)
    catalog = None
    if catalog_kind == "postgres":
        db = "qsm_bench_load"
        subprocess.run(["psql", "-h", "127.0.0.1", "-U", "postgres", "-qc",
                        f"DROP DATABASE IF EXISTS {db} WITH (FORCE)"], check=True)
        subprocess.run(["psql", "-h", "127.0.0.1", "-U", "postgres", "-qc",
                        f"CREATE DATABASE {db}"], check=True)
        catalog = f"{PG}/{db}"
    pool_dir = os.path.join(cell, "pool")
    pool = S3(pool_dir) if pool_kind == "s3" else pool_dir
    servers = [Server(os.path.join(cell, "srv0"), pool, catalog)]
    if nservers > 1:
        # A catalog on PostgreSQL is shared; SQLite is one server's.
        if catalog is None:
            servers[0].stop()
            raise SystemExit("two servers need the PostgreSQL catalog")
        servers += [Server(os.path.join(cell, f"srv{k}"), pool, catalog)
                    for k in range(1, nservers)]
    try:
        idle = [probe_once(servers[0]) for _ in range(5)]
        for c in range(nclients):
            r = servers[0].admin("register-node", f"n{c}", stdin=PASSWORD + "\n")
            if r.returncode != 0:
                raise SystemExit(f"register-node n{c}: {r.stderr}")
        cpu0 = {s.proc.pid: proc_cpu(s.proc.pid) for s in servers}
        s3 = pool if isinstance(pool, S3) else None
        backend0 = backends_cpu(s3)
        stop = threading.Event()
        latencies, expirations = [], [0]

        def probe():
            while not stop.is_set():
                latencies.append(probe_once(servers[-1]))
                stop.wait(0.1)

        def expire():
            while not stop.is_set():
                servers[0].admin("expire", "inventory")
                expirations[0] += 1
                stop.wait(0.5)

        threads = [threading.Thread(target=probe), threading.Thread(target=expire)]
        for t in threads:
            t.start()
        started = time.perf_counter()
        clients = []
        for c in range(nclients):
            mine = servers[c % nservers]
            order = [mine] + [s for s in servers if s is not mine]
            env = dict(os.environ, QSM_SERVER=",".join(s.url for s in order), QSM_NODE=f"n{c}",
                       QSM_PASSWORD_FILE=pwfile, HOME=cell,
                       QSM_HOME=os.path.join(cell, "no-embedded"))
            t0 = time.perf_counter()
            extra = ["--compression", compression] if compression else []
            p = subprocess.Popen([QSM, "backup", "--json", *extra, trees[c]], env=env,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            clients.append((c, p, t0))
        def reap(p, t0, slot):
            # Each client is timed when it ends, not when the ones started before it have.
            stdout, stderr = p.communicate()
            slot.append((time.perf_counter() - t0, stdout, stderr))
        reapers = []
        for c, p, t0 in clients:
            slot = []
            th = threading.Thread(target=reap, args=(p, t0, slot))
            th.start()
            reapers.append((c, p, th, slot))
        results = []
        for c, p, th, slot in reapers:
            th.join()
            wall, stdout, stderr = slot[0]
            ok = p.returncode == 0
            report = json.loads(stdout)[0] if ok and stdout.strip() else {}
            results.append({"client": c, "ok": ok, "wall": wall,
                            "bytes": report.get("bytes_read", 0),
                            "error": "" if ok else stderr.strip()[-300:]})
        wall = time.perf_counter() - started
        stop.set()
        for t in threads:
            t.join()
        cpu = sum(proc_cpu(s.proc.pid) - cpu0[s.proc.pid] for s in servers)
        backend_cpu = backends_cpu(s3) - backend0
        rss = max(proc_hwm_mb(s.proc.pid) for s in servers)
        # Every client's data comes back intact.
        bad_restores = 0
        for c in range(nclients if verify else 0):
            target = os.path.join(cell, "restored", f"c{c}")
            env = dict(os.environ, QSM_SERVER=servers[c % nservers].url, QSM_NODE=f"n{c}",
                       QSM_PASSWORD_FILE=pwfile, HOME=cell,
                       QSM_HOME=os.path.join(cell, "no-embedded"))
            r = subprocess.run([QSM, "restore", trees[c], "--to", target], env=env,
                               capture_output=True, text=True)
            same = r.returncode == 0 and subprocess.run(
                ["diff", "-r", "-q", trees[c], target], capture_output=True).returncode == 0
            bad_restores += 0 if same else 1
            shutil.rmtree(target, ignore_errors=True)
        total = sum(r["bytes"] for r in results)
        per = [r["bytes"] / r["wall"] / 1e6 for r in results if r["ok"]]
        cell_result = {
            "catalog": catalog_kind, "pool": pool_kind, "servers": nservers,
            "clients": nclients,
            "wall_s": wall, "mb": total / 1e6, "aggregate_mb_s": total / 1e6 / wall,
            "per_client_median_mb_s": statistics.median(per) if per else 0.0,
            "per_client_min_mb_s": min(per) if per else 0.0,
            "probe_idle_ms": statistics.median(idle),
            "probe_p50_ms": percentile(latencies, 50), "probe_p99_ms": percentile(latencies, 99),
            "probes": len(latencies), "expirations": expirations[0],
            "server_cpu_s": cpu, "server_cpu_pct": 100 * cpu / wall / os.cpu_count(),
            "server_rss_mb": rss, "backend_cpu_s": backend_cpu,
            "failed_clients": sum(1 for r in results if not r["ok"]),
            "failed_restores": bad_restores,
            "errors": [r["error"] for r in results if not r["ok"]][:3],
            "client_walls_s": sorted(round(r["wall"], 2) for r in results),
        }
        return cell_result
    finally:
        for s in servers:
            s.stop()
        if isinstance(pool, S3):
            pool.stop()
        shutil.rmtree(pool_dir, ignore_errors=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--clients", default="1,8,32,64")
    ap.add_argument("--files", type=int, default=400)
    ap.add_argument("--file-kib", type=int, default=80)
    ap.add_argument("--catalogs", default="sqlite,postgres")
    ap.add_argument("--pools", default="dir")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--servers", default="1,2")
    ap.add_argument("--out", default=os.path.join(REPO, "bench", "out", "load"))
    a = ap.parse_args()
    counts = [int(x) for x in a.clients.split(",")]
    os.makedirs(a.out, exist_ok=True)
    if "postgres" in a.catalogs:
        subprocess.run(["bash", os.path.join(REPO, "scripts", "ensure-postgres.sh")], check=True)
    subprocess.run(["cargo", "build", "--release", "-p", "qsm", "--manifest-path",
                    os.path.join(REPO, "Cargo.toml")], check=True, stdout=sys.stderr)
    if "s3" in a.pools:
        subprocess.run(["cargo", "build", "--release", "-p", "qsm-pool-s3", "--features",
                        "test-server", "--example", "s3-test-server", "--manifest-path",
                        os.path.join(REPO, "Cargo.toml")], check=True, stdout=sys.stderr)
    trees = []
    mix = corpus_mix(a.out)
    for c in range(max(counts)):
        root = os.path.join(a.out, "trees", f"silesia-{a.files}x{a.file_kib}k", f"c{c}")
        make_tree(root, c, a.files, a.file_kib, mix)
        trees.append(root)
    del mix
    pwfile = os.path.join(a.out, "pw")
    with open(pwfile, "w") as f:
        f.write(PASSWORD + "\n")
    os.chmod(pwfile, 0o600)
    cells = []
    for kind in a.catalogs.split(","):
        for pool_kind in a.pools.split(","):
            for ns in [int(x) for x in a.servers.split(",")]:
                if ns > 1 and kind == "sqlite":
                    continue
                for n in counts:
                    runs = [run_cell(a.out, kind, pool_kind, ns, n, trees, pwfile)
                            for _ in range(max(1, a.repeat))]
                    runs.sort(key=lambda x: x["aggregate_mb_s"])
                    r = dict(runs[len(runs) // 2])
                    r["aggregate_runs"] = [x["aggregate_mb_s"] for x in runs]
                    for k in ("failed_clients", "failed_restores"):
                        r[k] = sum(x[k] for x in runs)
                    r["errors"] = [e for x in runs for e in x["errors"]][:3]
                    cells.append(r)
                    print(f"{kind} {pool_kind} {ns} server(s) {n} clients: "
                          f"{r['aggregate_mb_s']:.1f} MB/s, {r['failed_clients']} failed, "
                          f"{r['failed_restores']} bad restores", file=sys.stderr)
    uname = os.uname()
    lines = [
        f"Machine: {os.cpu_count()} cores, {uname.sysname} {uname.release}; "
        f"each client {a.files} files x {a.file_kib} KiB "
        f"({tree_bytes(trees[0]) / 1e6:.1f} MB), default compression (auto: zstd-3); "
        f"median of {max(1, a.repeat)} runs per cell.",
        "",
        "| catalog | pool | servers | clients | wall s | aggregate MB/s (min-max) | per client MB/s (median / min) "
        "| probe p50 / p99 ms (idle) | server CPU s (% of machine) | PostgreSQL + S3 CPU s "
        "| server RSS MB "
        "| expirations | failed clients | bad restores |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in cells:
        lines.append(
            f"| {r['catalog']} | {r['pool']} | {r['servers']} | {r['clients']} "
            f"| {r['wall_s']:.1f} "
            f"| {r['aggregate_mb_s']:.0f} ({min(r['aggregate_runs']):.0f}-"
            f"{max(r['aggregate_runs']):.0f}) | {r['per_client_median_mb_s']:.2f} / "
            f"{r['per_client_min_mb_s']:.2f} | {r['probe_p50_ms']:.0f} / {r['probe_p99_ms']:.0f} "
            f"({r['probe_idle_ms']:.0f}) | {r['server_cpu_s']:.1f} ({r['server_cpu_pct']:.0f}%) "
            f"| {r['backend_cpu_s']:.1f} "
            f"| {r['server_rss_mb']:.0f} | {r['expirations']} | {r['failed_clients']} "
            f"| {r['failed_restores']} |")
    # The target: 32 clients at >= 80% of the best aggregate of their configuration.
    for key in sorted({(r["catalog"], r["pool"], r["servers"]) for r in cells}):
        group = [r for r in cells if (r["catalog"], r["pool"], r["servers"]) == key]
        best = max(r["aggregate_mb_s"] for r in group)
        at32 = [r for r in group if r["clients"] == 32]
        if at32 and best > 0:
            lines.append("")
            lines.append(
                f"{key[0]} catalog, {key[1]} pool, {key[2]} server(s): 32 clients reach "
                f"{100 * at32[0]['aggregate_mb_s'] / best:.0f}% of the best aggregate "
                f"({best:.1f} MB/s).")
    table = "\n".join(lines) + "\n"
    with open(os.path.join(a.out, "load.md"), "w") as f:
        f.write(table)
    with open(os.path.join(a.out, "load.json"), "w") as f:
        json.dump(cells, f, indent=2)
    print(table)
    failed = sum(r["failed_clients"] + r["failed_restores"] for r in cells)
    for r in cells:
        for e in r["errors"]:
            print(f"error ({r['catalog']}, {r['pool']}, {r['servers']}s, {r['clients']}c): {e}",
                  file=sys.stderr)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
