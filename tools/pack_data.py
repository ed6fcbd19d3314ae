#!/usr/bin/python3
"""Packs a CamVid-style data set small enough to carry to the GPU machine.

  /usr/bin/python3 tools/pack_data.py /work/shared/data/camvid gpu-data

The device machine may not see ../shared, and what travels with a run is
64 MiB in all (docs/gpu.md): the 468 train + val images as PNG are 122 MB,
re-encoded as quality-95 JPEG plus the label
PNGs as they are they come to about 30 MB. OUT gets the same layout and list
files (train.txt, val.txt; image paths end in .jpg), so
`train.py --data-root OUT` and `--holdout SEQ` work on it unchanged (frame
names, which carry the sequence, are kept). OUT is written next to itself
and renamed into place: an interrupted pack leaves no half folder. Labels are
copied byte for byte: a JPEG would change class ids.
"""

import argparse
import os
import shutil
import sys

from PIL import Image

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_splits  # noqa: E402

QUALITY = 95


def pack(data_root, out, lists=make_splits.DEFAULT_LISTS, quality=QUALITY):
    """Writes the pack; returns (images, total bytes)."""
    out = os.path.abspath(out)
    if os.path.exists(out):
        raise FileExistsError("%s exists (remove it to re-pack)" % out)
    tmp = out + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    root = os.path.abspath(data_root)
    n = 0
    for name in lists:
        lines = []
        for img, lab in make_splits.read_list(os.path.join(root, name)):
            rel_img = os.path.splitext(os.path.relpath(img, root))[0] + ".jpg"
            rel_lab = os.path.relpath(lab, root)
            for rel in (rel_img, rel_lab):
                if rel.startswith(".."):
                    raise ValueError("%s: %s is outside the data folder" % (name, rel))
                os.makedirs(os.path.join(tmp, os.path.dirname(rel)), exist_ok=True)
            Image.open(img).convert("RGB").save(os.path.join(tmp, rel_img), quality=quality)
            shutil.copyfile(lab, os.path.join(tmp, rel_lab))
            lines.append("%s %s\n" % (rel_img, rel_lab))
            n += 1
        with open(os.path.join(tmp, name), "w") as f:
            f.writelines(lines)
    total = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(tmp) for f in fs)
    os.replace(tmp, out)
    return n, total


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("data_root")
    ap.add_argument("out", nargs="?", default="gpu-data", help="pack folder (default gpu-data, git-ignored)")
    ap.add_argument("--quality", type=int, default=QUALITY)
    args = ap.parse_args(argv)
    try:
        n, total = pack(args.data_root, args.out, quality=args.quality)
    except (OSError, ValueError) as e:
        print("pack_data: %s" % e, file=sys.stderr)
        return 1
    print("packed %d images + labels into %s: %.1f MB" % (n, args.out, total / 1e6))
    return 0


if __name__ == "__main__":
    sys.exit(main())
