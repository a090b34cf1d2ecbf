"""Turns the stage records of real backups (`QSM_ADAPTIVE_RECORD`), one backup per rung of
the adaptive ladder over the same data, into the trace the controller's tests replay
(crates/qsm-client/tests/traces): per group of consecutive quanta (about 1 MiB of input),
the input bytes, the reader's seconds, and per rung the worker's seconds, the frame bytes
and the sender's seconds.

    python3 trace.py NAME 'WHAT' RUNG=RECORD... > NAME.tsv
"""

import statistics
import sys

GROUP = 1 << 20


def load(path):
    reads, comp, sent = [], {}, {}
    with open(path) as f:
        for line in f:
            p = line.split()
            if p[0] == "read":
                reads.append((int(p[2]), float(p[3])))
            elif p[0] == "compressed":
                comp[int(p[2])] = (int(p[4]), int(p[5]), float(p[7]))
            elif p[0] == "sent":
                sent[int(p[2])] = float(p[5])
    seqs = sorted(comp)
    if len(reads) != len(seqs):
        raise SystemExit(f"{path}: {len(reads)} reads for {len(seqs)} frames")
    return [(comp[q][0], reads[k][1], comp[q][2], comp[q][1], sent.get(q, 0.0))
            for k, q in enumerate(seqs)]


def main():
    name, what, pairs = sys.argv[1], sys.argv[2], [a.split("=", 1) for a in sys.argv[3:]]
    runs = [(rung, load(path)) for rung, path in pairs]
    n = len(runs[0][1])
    for rung, r in runs:
        if len(r) != n or any(a[0] != b[0] for a, b in zip(r, runs[0][1])):
            raise SystemExit(f"{rung}: not the same quanta as {runs[0][0]}")
    rows, group = [], None
    for k in range(n):
        size = runs[0][1][k][0]
        read = statistics.median(r[k][1] for _, r in runs)
        cells = [(r[k][2], r[k][3], r[k][4]) for _, r in runs]
        if group is None:
            group = [0, 0.0, [[0.0, 0, 0.0] for _ in runs]]
        group[0] += size
        group[1] += read
        for g, c in zip(group[2], cells):
            g[0] += c[0]
            g[1] += c[1]
            g[2] += c[2]
        if group[0] >= GROUP or k == n - 1:
            rows.append(group)
            group = None
    print(f"# {name}: {what}")
    print(f"# {n} quanta in {len(rows)} groups; recorded by bench/adaptive-trace.sh")
    print("bytes\tread_us\t" + "\t".join(f"{rung}:cpu_us\t{rung}:frame\t{rung}:send_us"
                                          for rung, _ in runs))
    for size, read, cells in rows:
        print(f"{size}\t{read * 1e6:.0f}\t" + "\t".join(
            f"{c * 1e6:.0f}\t{f}\t{s * 1e6:.0f}" for c, f, s in cells))


main()
