#!/usr/bin/python3
"""One attention layer, side by side: mitaseg's MiTA and full attention
(bench/bench_mita.c: op_mita, op_attention_full, and OpenBLAS sgemm on
the layer's qkv-projection GEMM and on a 1024^3 GEMM) against PyTorch's full
attention, interleaved run by run, same thread count.

  /usr/bin/python3 bench/bench_mita.py [--build build] [--threads 2]
      [--rounds 5] [--n 1024,4096,16384] [--heads 3,6] [--full-max N]
      [--openblas-env native|keep]

PyTorch here is Debian's 1.13, which has no scaled_dot_product_attention:
its contender is softmax(q k^T s) v by torch.matmul and torch.softmax, per
head, in query blocks of 2048 rows (one (N, N) score matrix of a head at
N = 16384 would take 1 GiB). Same shapes: d = 64, M = 7x7 landmarks, k = 49,
random q, k, v. The C side runs as one persistent worker (--serve) that is
asked for one round at a time, so each round times C and PyTorch back to
back. Reported: min and median ms of each, GF/s (useful FLOPs: MiTA
2 N d (4 M + 2 k) per head, full attention 4 N^2 d per head), and the ratios
asked of MiTA in issue 13. Exits 77 (skipped) where torch is missing.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_cpu import add_openblas_env_arg, openblas_env  # noqa: E402


def flops_mita(n, heads, d=64, m=49, k=49):
    return 2.0 * n * d * (4 * m + 2 * k) * heads


def flops_full(n, heads, d=64):
    return 4.0 * n * n * d * heads


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", default="build")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--n", default="1024,4096,16384")
    ap.add_argument("--heads", default="3,6")
    ap.add_argument("--full-max", type=int, default=1 << 30,
                    help="skip both full attentions above this N")
    add_openblas_env_arg(ap)
    a = ap.parse_args()
    print(openblas_env(a.openblas_env), file=sys.stderr)   # before torch loads OpenBLAS
    try:
        import torch
    except ImportError:
        print("bench_mita.py: torch is not installed; skipped", file=sys.stderr)
        return 77
    torch.set_num_threads(a.threads)
    exe = os.path.join(a.build, "bench_mita")
    env = dict(os.environ, OMP_WAIT_POLICY="PASSIVE")
    worker = subprocess.Popen([exe, "--serve", "--threads", str(a.threads),
                               "--full-max", str(a.full_max)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
    hello = json.loads(worker.stdout.readline())
    configs = [(n, h) for h in map(int, a.heads.split(",")) for n in map(int, a.n.split(","))]
    times = {c: {} for c in configs}

    def add(cfg, name, ms):
        times[cfg].setdefault(name, []).append(ms)

    def torch_full(q, k, v, scale):
        out = torch.empty_like(q)
        for i in range(0, q.shape[1], 2048):
            s = torch.matmul(q[:, i:i + 2048], k.transpose(1, 2)) * scale
            out[:, i:i + 2048] = torch.matmul(torch.softmax(s, dim=-1), v)
        return out

    for rnd in range(a.rounds + 1):  # round 0: warm-up
        for cfg in configs:
            n, h = cfg
            worker.stdin.write(f"{n} {h}\n")
            worker.stdin.flush()
            res = json.loads(worker.stdout.readline())
            if n <= a.full_max:
                g = torch.Generator().manual_seed(n)
                q, k, v = (torch.rand(h, n, 64, generator=g) * 2 - 1 for _ in range(3))
                with torch.inference_mode():
                    t0 = time.perf_counter()
                    torch_full(q, k, v, 64 ** -0.5)
                    res["torch_full_ms"] = (time.perf_counter() - t0) * 1e3
            if rnd == 0:
                continue
            for key, ms in res.items():
                if key.endswith("_ms"):
                    add(cfg, key[:-3], ms)
    worker.stdin.close()
    worker.wait()

    print(f"threads {a.threads}, {a.rounds} rounds; OpenBLAS {hello['openblas']} "
          f"({hello['core']}); torch {torch.__version__}; load {os.getloadavg()[0]:.2f}")
    print("\n| heads | N | MiTA ms min / med | MiTA GF/s | our full ms min / med "
          "| torch full ms min / med | our full / MiTA | torch full / MiTA | sgemm qkv GF/s "
          "| sgemm 1024^3 GF/s | MiTA / GEMM rate |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for cfg in configs:
        n, h = cfg
        t = times[cfg]
        mn = {k: min(v) for k, v in t.items()}
        md = {k: statistics.median(v) for k, v in t.items()}
        gm = flops_mita(n, h) / mn["mita"] / 1e6
        gq = 2.0 * n * (64 * h) * (3 * 64 * h) / mn["gemm_qkv"] / 1e6
        gs = 2.0 * 1024 ** 3 / mn["gemm_1024"] / 1e6
        full = (f"{mn['full']:.1f} / {md['full']:.1f}" if "full" in mn else "-")
        tfull = (f"{mn['torch_full']:.1f} / {md['torch_full']:.1f}" if "torch_full" in mn else "-")
        r_full = f"{mn['full'] / mn['mita']:.1f}x" if "full" in mn else "-"
        r_torch = f"{mn['torch_full'] / mn['mita']:.1f}x" if "torch_full" in mn else "-"
        print(f"| {h} | {n} | {mn['mita']:.2f} / {md['mita']:.2f} | {gm:.1f} | {full} | {tfull} | "
              f"{r_full} | {r_torch} | {gq:.1f} | {gs:.1f} | {100 * gm / max(gq, gs):.0f} % |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
