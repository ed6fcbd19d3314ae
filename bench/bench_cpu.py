#!/usr/bin/env python3
"""CPU benchmark: the same model file run by mitaseg (C engine) and by the
PyTorch reference (tools/mitaseg_ref.py), same threads, same input, side by
side in one run; prints the time ratio for MiTA and for full attention.

  /usr/bin/python3 bench/bench_cpu.py [--build build] [--threads 2] [--size 512]

The model is a DeiT-Tiny-sized UperNet (patch 16, 192 wide, 12 blocks, 3
heads, mln neck 192, head 128 channels, 11 classes; bench/make_bench_model.py)
with random weights: speed does not depend on the weights.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

# Both sides use passive OpenMP waiting (mitaseg sets it for itself; libgomp
# reads it at load time, so it must be set before torch is imported).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import numpy as np  # noqa: E402
import torch  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tools"))
import mitaseg_ref  # noqa: E402
from make_bench_model import write_bench_model  # noqa: E402


def time_torch(model, img, attention, repeat):
    with torch.no_grad():
        mitaseg_ref.segment(model, img, attn={"type": attention})  # warm-up
        times = []
        for _ in range(repeat):
            t0 = time.perf_counter()
            mitaseg_ref.segment(model, img, attn={"type": attention})
            times.append((time.perf_counter() - t0) * 1e3)
    return sum(times) / len(times), min(times)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=os.path.join(HERE, "..", "build"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--size", type=int, default=512)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    rng = np.random.default_rng(12345)
    img = rng.integers(0, 256, (args.size, args.size, 3), dtype=np.uint8)
    exe = os.path.join(args.build, "bench_engine")
    print("DeiT-Tiny-sized UperNet, %dx%d input (%d tokens), %d threads, mean of %d runs"
          % (args.size, args.size, (args.size // 16) ** 2, args.threads, args.repeat))
    print("%-10s %12s %12s %10s" % ("attention", "mitaseg ms", "pytorch ms", "ratio"))
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "deit-tiny.safetensors")
        model = write_bench_model("deit-tiny", args.size, path)
        for attention in ("mita", "full"):
            out = subprocess.run([exe, "--model", path, "--size", "%dx%d" % (args.size, args.size),
                                  "--threads", str(args.threads), "--repeat", str(args.repeat),
                                  "--attention", attention],
                                 check=True, capture_output=True, text=True)
            c = json.loads(out.stdout)
            t_mean, _ = time_torch(model, img, attention, args.repeat)
            print("%-10s %12.1f %12.1f %9.2fx" % (attention, c["mean_ms"], t_mean,
                                                  t_mean / c["mean_ms"]))
    print("ratio = PyTorch time / mitaseg time (higher: mitaseg faster)")


if __name__ == "__main__":
    main()
