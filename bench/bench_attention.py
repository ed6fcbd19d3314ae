#!/usr/bin/python3
"""Full attention on the CPU, one layer: mitaseg's op_attention_full
(bench/bench_attention, one or more builds) against PyTorch, same shapes,
same threads, interleaved, in one run.

  /usr/bin/python3 bench/bench_attention.py [--build build ...] [--threads 2]
      [--n 1024,4096,16384] [--models ti,s] [--rounds 7] [--no-sdpa] [--no-matmul]
      [--torch-python PY ...] [--json OUT.json]

Shapes: DeiT-Ti (C = 192, 3 heads) and DeiT-S (C = 384, 6 heads), head dim
64, input qkv (N, 3C) as the engine holds it, output (N, C) heads
concatenated. What is timed: the whole op on that layout; for PyTorch the
split/permute views and the final transpose+reshape copy are included, as
the engine's op includes them.

Contenders, each a persistent worker process asked one run at a time, the
order rotated every round (the CPU is shared: interleaving spreads the load
evenly; the report prints `uptime` before and after):
  - mitaseg, each --build given (e.g. a build of the old tree and the new);
  - PyTorch 1.13 from Debian (/usr/bin/python3): it has no
    scaled_dot_product_attention, so it runs matmul, softmax, matmul (the
    (N, N) scores materialised);
  - PyTorch 2.x from the registry with torch.nn.functional.
    scaled_dot_product_attention (its fused CPU flash attention), in
    build-bench-torch-venv/ (git-ignored), made on first use by this script
    (pip install torch from PyPI: 5.4 GB installed with its CUDA libraries;
    the PyTorch CPU wheel index is not always reachable). Where it cannot be
    installed the column is skipped with the reason; --no-sdpa skips it.
Reported per shape: min and median wall ms over --rounds, ratio contender /
mitaseg (first --build; > 1: mitaseg faster), and the median CPU time of all
the worker's threads (process CPU time around the call: on a loaded machine
it is steadier than wall time, as time spent descheduled is not counted).
Outputs are checked at the smallest N (at most 1024): every mitaseg build
and every PyTorch against a float64 numpy reference on the same input
(max |a - b| / max |b| below 1e-4); exit status 1 if one is not.
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(REPO, "tools"))
sys.path.insert(0, HERE)
# Worker: one persistent worker process, asked line by line
from bench_cpu import Worker, add_openblas_env_arg, openblas_env  # noqa: E402

VENV_DIR = os.path.join(REPO, "build-bench-torch-venv")
MODELS = {"ti": (192, 3), "s": (384, 6)}
MAX_REL_ERROR = 1e-4


def torch_venv():
    """(python, None) or (None, why): a venv with PyTorch 2.x from PyPI, made
    by tools/ort_venv.py's ensure (a finished install or none)."""
    import ort_venv
    return ort_venv.ensure(VENV_DIR, packages=["torch>=2.0", "numpy"], system_site=False,
                           check="import torch, numpy; "
                           "torch.nn.functional.scaled_dot_product_attention; "
                           "print('torch', torch.__version__)")


def reference(qkv, heads):
    """float64 softmax(q k^T / sqrt(d)) v, heads concatenated."""
    import numpy as np
    n, c3 = qkv.shape
    c = c3 // 3
    d = c // heads
    x = qkv.astype(np.float64).reshape(n, 3, heads, d).transpose(1, 2, 0, 3)
    s = x[0] @ x[1].transpose(0, 2, 1) / np.sqrt(d)
    s = np.exp(s - s.max(-1, keepdims=True))
    s /= s.sum(-1, keepdims=True)
    return (s @ x[2]).transpose(1, 0, 2).reshape(n, c)


# ---------------------------------------------------------------- workers

def worker_torch(args):
    """Answers "run N" with {"ms"} and "dump N PATH" (qkv then out, float32)."""
    import numpy as np
    import torch
    torch.set_num_threads(args.threads)
    torch.set_num_interop_threads(1)
    sdpa = getattr(torch.nn.functional, "scaled_dot_product_attention", None)
    c, heads = args.c, args.heads
    d = c // heads
    cache = {}

    def attend(qkv, n):
        q, k, v = qkv.view(n, 3, heads, d).permute(1, 2, 0, 3)
        if sdpa is not None:
            o = sdpa(q, k, v)
        else:
            o = torch.softmax((q @ k.transpose(-1, -2)) * (1.0 / d ** 0.5), -1) @ v
        return o.transpose(0, 1).reshape(n, c)

    print(json.dumps({"ready": True, "name": "PyTorch %s %s" % (
        torch.__version__, "SDPA" if sdpa else "matmul+softmax+matmul"),
        "threads": torch.get_num_threads()}), flush=True)
    for line in iter(sys.stdin.readline, ""):
        w = line.split()
        n = int(w[1])
        if w[0] == "dump":
            qkv = torch.from_numpy(np.fromfile(w[2], dtype=np.float32).reshape(n, 3 * c))
            with torch.inference_mode():
                attend(qkv, n).numpy().tofile(w[2] + ".out")
            print(json.dumps({"ok": True}), flush=True)
            continue
        if n not in cache:
            cache = {n: torch.rand(n, 3 * c) * 4 - 2}
        with torch.inference_mode():
            t0, c0 = time.perf_counter(), time.process_time()
            attend(cache[n], n)
            ms, cpu_ms = (time.perf_counter() - t0) * 1e3, (time.process_time() - c0) * 1e3
        print(json.dumps({"ms": ms, "cpu_ms": cpu_ms}), flush=True)


def uptime():
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", action="append", help="mitaseg build folder(s); default build")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--n", default="1024,4096,16384")
    ap.add_argument("--models", default="ti,s")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--no-sdpa", action="store_true")
    ap.add_argument("--no-matmul", action="store_true",
                    help="skip Debian's PyTorch 1.13 (slow at large N: (N, N) scores)")
    ap.add_argument("--torch-python", action="append", help="more pythons with torch")
    ap.add_argument("--json")
    add_openblas_env_arg(ap)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--c", type=int, default=192, help=argparse.SUPPRESS)
    ap.add_argument("--heads", type=int, default=3, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        return worker_torch(args)
    blas_note = openblas_env(args.openblas_env)   # before numpy loads OpenBLAS here
    import numpy as np

    builds = args.build or ["build"]
    for b in builds:
        if not os.access(os.path.join(b, "bench_attention"), os.X_OK):
            sys.exit("bench_attention: %s/bench_attention not found (ninja -C %s bench_attention)"
                     % (b, b))
    ns = [int(x) for x in args.n.split(",")]
    pythons = ([] if args.no_matmul else ["/usr/bin/python3"]) + (args.torch_python or [])
    notes = []
    if not args.no_sdpa:
        py, why = torch_venv()
        if py:
            pythons.append(py)
        else:
            notes.append("PyTorch 2.x (SDPA) skipped: " + why)
    print(uptime())
    print(blas_note)
    for n_ in notes:
        print(n_)
    results = []
    bad = False
    logdir = tempfile.mkdtemp(prefix="bench_attention.")
    for model in args.models.split(","):
        c, heads = MODELS[model]
        workers = []
        for i, b in enumerate(builds):
            exe = os.path.join(b, "bench_attention")
            workers.append(Worker(b, [exe, "--c", str(c), "--heads", str(heads), "--threads",
                                      str(args.threads)],
                                  os.path.join(logdir, "mitaseg%d.log" % i)))
        for i, py in enumerate(pythons):
            workers.append(Worker(py, [py, os.path.abspath(__file__), "--worker", "--threads",
                                       str(args.threads), "--c", str(c), "--heads", str(heads)],
                                  os.path.join(logdir, "torch%d.log" % i)))
        names = [("mitaseg %s (%s)" % (w.key, w.info.get("cpu_path"))) if "cpu_path" in w.info
                 else w.info["name"] for w in workers]
        # correctness on the C worker's input at the smallest N, at most 1024
        # (the float64 reference holds heads x N x N scores)
        n0 = min(ns + [1024])
        path = os.path.join(logdir, "qkv.f32")
        workers[0].ask("dump %d %s" % (n0, path))
        raw = np.fromfile(path, dtype=np.float32)
        qkv = raw[:n0 * 3 * c].reshape(n0, 3 * c)
        want = reference(qkv, heads)
        qkv.tofile(path + ".in")
        for w, name in zip(workers, names):
            if "cpu_path" in w.info:
                w.ask("dump %d %s" % (n0, path))
                got = np.fromfile(path, dtype=np.float32)[n0 * 3 * c:]
            else:
                w.ask("dump %d %s" % (n0, path + ".in"))
                got = np.fromfile(path + ".in.out", dtype=np.float32)
            err = float(np.abs(got.reshape(n0, c) - want).max() / np.abs(want).max())
            print("%s: rel error vs float64 at N=%d: %.1e" % (name, n0, err))
            bad |= not err < MAX_REL_ERROR
        for n in ns:
            times = [[] for _ in workers]
            cpu = [[] for _ in workers]
            for w in workers:   # warm-up at this N
                w.ask("run %d" % n)
            for r in range(args.rounds):
                order = list(range(len(workers)))
                order = order[r % len(order):] + order[:r % len(order)]
                for i in order:
                    a = workers[i].ask("run %d" % n)
                    times[i].append(a["ms"])
                    cpu[i].append(a["cpu_ms"])
                    time.sleep(0.05)
            base = statistics.median(times[0])
            cbase = statistics.median(cpu[0])
            print("\nDeiT-%s C=%d heads=%d N=%d, %d threads, %d rounds; ratio: median vs %s"
                  % (model.upper(), c, heads, n, args.threads, args.rounds, names[0]))
            print("  %-46s %9s %9s %7s %13s %7s" % ("", "min ms", "median", "ratio",
                                                    "CPU ms median", "ratio"))
            for i, name in enumerate(names):
                mn, md, cm = min(times[i]), statistics.median(times[i]), statistics.median(cpu[i])
                print("  %-46s %9.2f %9.2f %6.2fx %13.2f %6.2fx" % (name, mn, md, md / base, cm,
                                                                  cm / cbase))
                results.append({"model": model, "n": n, "contender": name, "min_ms": mn,
                                "median_ms": md, "cpu_median_ms": cm, "times": times[i],
                                "cpu_times": cpu[i]})
        for w in workers:
            w.close()
    print(uptime())
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"results": results, "notes": notes}, f, indent=1)
    shutil.rmtree(logdir, ignore_errors=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
