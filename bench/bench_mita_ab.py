#!/usr/bin/python3
"""One MiTA layer, two builds (or more) side by side: an A/B of op_mita on a
machine whose speed drifts within seconds. Each build's bench_mita runs as
one persistent worker (--serve); every round asks each worker for one
timed round of each case in turn, the order alternating by round, so the
builds see the same machine. Reported per case and build: min and median
ms, the median of the per-round rate against the qkv GEMM timed in that
same round (paired, so a slow moment slows both), and the median per-round
ratio of the last build's time to the first's.

  /usr/bin/python3 bench/bench_mita_ab.py --build OLD --build NEW
      [--cases 690x3,1024x3,...] [--rounds 31]
"""
import argparse
import json
import statistics
import subprocess


def flops_mita(n, heads, d=64, m=49, k=49):
    return 2.0 * n * d * (4 * m + 2 * k) * heads


def flops_qkv(n, heads, d=64):
    c = heads * d
    return 2.0 * n * c * 3 * c


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", action="append", required=True)
    ap.add_argument("--cases", default="690x3,1024x3,4096x3,16384x3,690x6,1024x6,4096x6,16384x6")
    ap.add_argument("--rounds", type=int, default=31)
    a = ap.parse_args()
    cases = [tuple(int(v) for v in c.split("x")) for c in a.cases.split(",")]
    workers = []
    for b in a.build:
        p = subprocess.Popen([b + "/bench_mita", "--serve", "--full-max", "1"],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        json.loads(p.stdout.readline())  # ready
        workers.append(p)
    res = {(i, c): [] for i in range(len(workers)) for c in cases}
    for r in range(a.rounds):
        order = list(range(len(workers)))
        if r % 2:
            order.reverse()
        for c in cases:
            for i in order:
                workers[i].stdin.write("%d %d\n" % c)
                workers[i].stdin.flush()
                j = json.loads(workers[i].stdout.readline())
                res[(i, c)].append((j["mita_ms"], j["gemm_qkv_ms"]))
    print("| N | heads | " + " | ".join(
        "%s: min / med ms | of qkv rate (paired med)" % b for b in a.build) +
        " | last / first (paired med) |")
    print("|---|---|" + "---|---|" * len(a.build) + "---|")
    for c in cases:
        cells = []
        for i in range(len(workers)):
            t = [x[0] for x in res[(i, c)]]
            rate = [flops_mita(*c) / x[0] / (flops_qkv(*c) / x[1]) for x in res[(i, c)]]
            cells.append("%.3f / %.3f | %.1f %%" % (min(t), statistics.median(t),
                                                     100 * statistics.median(rate)))
        ratio = statistics.median(
            [y[0] / x[0] for x, y in zip(res[(0, c)], res[(len(workers) - 1, c)])])
        print("| %d | %d | %s | %.3f |" % (c[0], c[1], " | ".join(cells), ratio), flush=True)
    for p in workers:
        p.stdin.close()
        p.wait()


if __name__ == "__main__":
    main()
