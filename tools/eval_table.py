#!/usr/bin/env python3
"""Measures a model with the C engine (`mitaseg eval`) at several MiTA budgets
and with full attention, and prints the markdown table the README shows.

  /usr/bin/python3 tools/eval_table.py --bin build/mitaseg \\
      --model assets/models/camvid-mita.safetensors \\
      --list ../shared/data/camvid/val.txt [--json-dir DIR] [--threads 2]

Runs (--runs budgets, the default): the model's own attention (as trained),
landmarks 5x5 and 9x9, k 25 and 98, and the same weights with full attention.
--runs tta: MiTA as trained and full attention, each without and with
--tta flip (the cross-sequence table of the README).
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
TTA_RUNS = [("MiTA as trained", []),
            ("MiTA, --tta flip", ["--tta", "flip"]),
            ("full attention", ["--attention", "full"]),
            ("full attention, --tta flip", ["--attention", "full", "--tta", "flip"])]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default="build/mitaseg")
    ap.add_argument("--model", required=True)
    ap.add_argument("--list", required=True)
    ap.add_argument("--threads", default="2")
    ap.add_argument("--json-dir", default=None)
    ap.add_argument("--runs", default="budgets", choices=["budgets", "tta"])
    args = ap.parse_args()
    runs = TTA_RUNS if args.runs == "tta" else RUNS
    out_dir = args.json_dir or tempfile.mkdtemp()
    os.makedirs(out_dir, exist_ok=True)
    results = []
    for i, (label, extra) in enumerate(runs):
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
    print("\n%d images (%s), %s, %.0f ms/image (MiTA as trained, including image decoding)."
          % (r["images"], args.list, r["device"], r["ms_per_image"]))
    if args.runs == "tta":
        print("--tta flip: %.0f ms/image." % results[1][1]["ms_per_image"])


if __name__ == "__main__":
    main()
