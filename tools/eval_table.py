#!/usr/bin/env python3
"""Measures a model with the C engine (`mitaseg eval`) at several MiTA budgets
and with full attention, and prints the markdown table the README shows.

  /usr/bin/python3 tools/eval_table.py --bin build/mitaseg \\
      --model assets/models/camvid-mita.safetensors \\
      --list ../shared/data/camvid/val.txt [--json-dir DIR] [--threads 2]

Runs: the model's own attention (as trained), landmarks 5x5 and 9x9, k 25
and 98, and the same weights with full attention.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

RUNS = [("MiTA as trained", []),
        ("MiTA, landmarks 5x5", ["--landmarks", "5x5"]),
        ("MiTA, landmarks 9x9", ["--landmarks", "9x9"]),
        ("MiTA, k 25", ["--topk", "25"]),
        ("MiTA, k 98", ["--topk", "98"]),
        ("full attention", ["--attention", "full"])]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default="build/mitaseg")
    ap.add_argument("--model", required=True)
    ap.add_argument("--list", required=True)
    ap.add_argument("--threads", default="2")
    ap.add_argument("--json-dir", default=None)
    args = ap.parse_args()
    out_dir = args.json_dir or tempfile.mkdtemp()
    os.makedirs(out_dir, exist_ok=True)
    results = []
    for i, (label, extra) in enumerate(RUNS):
        path = os.path.join(out_dir, "eval-%d.json" % i)
        cmd = [args.bin, "eval", "--list", args.list, "--model", args.model, "--json", path,
               "--threads", args.threads, "-q"] + extra
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        with open(path) as f:
            r = json.load(f)
        results.append((label, r))
        print("%-22s mIoU %.2f  aAcc %.2f  (%s, %.0f ms/image)"
              % (label, r["mIoU"], r["aAcc"], r["device"], r["ms_per_image"]), file=sys.stderr)

    names = [c["name"] for c in results[0][1]["classes"]]
    print("| run | landmarks | k | mIoU | aAcc | mAcc | " + " | ".join(names) + " |")
    print("|---|---|---|---|---|---|" + "---|" * len(names))
    for label, r in results:
        full = r["attention"] == "full"
        ious = {c["name"]: c["IoU"] for c in r["classes"]}
        print("| %s | %s | %s | %.2f | %.2f | %.2f | %s |"
              % (label, "-" if full else r["landmarks"], "-" if full else r["topk"], r["mIoU"],
                 r["aAcc"], r["mAcc"], " | ".join("%.1f" % ious[n] for n in names)))
    r = results[0][1]
    print("\n%d val images, %s, %.0f ms/image (MiTA as trained, including image decoding)."
          % (r["images"], r["device"], r["ms_per_image"]))


if __name__ == "__main__":
    main()
