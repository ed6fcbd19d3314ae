#!/usr/bin/env python3
"""Peak memory of `mitaseg segment` by image size, side by side: the default
run (the mask is the argmax taken while the logits are resized, band by band;
no full-size logits) against a run that keeps full-size logits (--dump), and
optionally against another build (--baseline BIN, e.g. an older commit).
Peak resident memory is each child's ru_maxrss; timings are not measured.

  /usr/bin/python3 bench/bench_memory.py [--build build] [--baseline OLD/mitaseg]
      [--model assets/models/camvid-mita.safetensors] [--image photo.png]
      [--sizes 480x360,1000x750,4000x3000]

Without --image the input is a synthetic block pattern; with one, that image
resized (PIL, bilinear) to each size.
"""
import argparse
import os
import subprocess
import sys
import tempfile

import numpy as np
from PIL import Image

HERE = os.path.dirname(os.path.abspath(__file__))


def peak_kib(cmd):
    """Runs cmd in a fresh Python child so ru_maxrss is this command's alone."""
    probe = ("import resource, subprocess, sys\n"
             "r = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)\n"
             "sys.stderr.buffer.write(r.stderr)\n"
             "print(r.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)\n")
    out = subprocess.run([sys.executable, "-c", probe] + cmd, capture_output=True, text=True)
    rc, kib = out.stdout.split()
    if rc != "0":
        raise SystemExit("failed (%s): %s\n%s" % (rc, " ".join(cmd), out.stderr))
    return int(kib)


def make_image(path, w, h, src):
    if src:
        Image.open(src).convert("RGB").resize((w, h), Image.BILINEAR).save(path)
        return
    r = np.random.default_rng(w * 7 + h)
    small = r.integers(0, 256, (h // 16 + 1, w // 16 + 1, 3), dtype=np.uint8)
    a = np.kron(small, np.ones((16, 16, 1), np.uint8))[:h, :w]
    Image.fromarray(a, "RGB").save(path)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=os.path.join(HERE, "..", "build"))
    ap.add_argument("--baseline", help="another mitaseg binary to compare with")
    ap.add_argument("--model", default=os.path.join(HERE, "..", "assets", "models",
                                                    "camvid-mita.safetensors"))
    ap.add_argument("--image")
    ap.add_argument("--sizes", default="480x360,1000x750,4000x3000")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    exe = os.path.join(args.build, "mitaseg")
    common = ["--model", args.model, "--device", "cpu", "--threads", str(args.threads), "-q"]
    print("peak resident memory of `mitaseg segment` (MiB), model %s"
          % os.path.basename(args.model))
    head = "%-11s %10s %14s %8s" % ("image", "default", "logits kept", "ratio")
    if args.baseline:
        head += " %10s %8s" % ("baseline", "ratio")
    print(head)
    with tempfile.TemporaryDirectory() as tmp:
        for size in args.sizes.split(","):
            w, h = (int(v) for v in size.split("x"))
            img = os.path.join(tmp, "img_%s.png" % size)
            make_image(img, w, h, args.image)
            lean = peak_kib([exe, "segment"] + common + [img, "-o", os.path.join(tmp, "a")])
            full = peak_kib([exe, "segment"] + common +
                            [img, "-o", os.path.join(tmp, "b"),
                             "--dump", os.path.join(tmp, "d.safetensors")])
            line = "%-11s %10.0f %14.0f %8.2f" % (size, lean / 1024, full / 1024, full / lean)
            if args.baseline:
                old = peak_kib([args.baseline, "segment"] + common +
                               [img, "-o", os.path.join(tmp, "c")])
                line += " %10.0f %8.2f" % (old / 1024, old / lean)
            print(line, flush=True)


if __name__ == "__main__":
    main()
