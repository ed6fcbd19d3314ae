#!/usr/bin/python3
"""Leave-one-sequence-out splits of a CamVid-style data set.

CamVid's val frames (0016E5) neighbour 204 of its train frames: val rewards
memorising that street. A fold that holds out a whole sequence measures what a
new street gets. The pool is every list given (default train.txt + val.txt of
the data root); the sequence of a frame is its file name up to the first '_'
(0016E5_07959.png -> 0016E5).

  /usr/bin/python3 tools/make_splits.py /work/shared/data/camvid splits/
      -> splits/xseq-0001TP/{train,val}.txt, splits/xseq-0006R0/..., splits/xseq-0016E5/...
  /usr/bin/python3 tools/make_splits.py DATA OUT --holdout 0006R0

The written lists hold paths relative to their own folder (what train.py and
`mitaseg eval --list` expect). train.py computes the same split on the fly
with `--holdout SEQ` (or "holdout" in the config's train section).
"""

import argparse
import os
import sys

DEFAULT_LISTS = ("train.txt", "val.txt")


def read_list(list_path):
    """`image label` lines -> absolute (image, label) pairs (paths relative to the list's folder)."""
    root = os.path.dirname(os.path.abspath(list_path))
    pairs = []
    with open(list_path) as f:
        for line in f:
            parts = line.split()
            if len(parts) >= 2 and not parts[0].startswith("#"):
                pairs.append((os.path.join(root, parts[0]), os.path.join(root, parts[1])))
    return pairs


def sequence_of(path):
    """CamVid sequence name of a frame: its file name up to the first '_'."""
    return os.path.basename(path).split("_", 1)[0]


def pool_pairs(data_root, lists=DEFAULT_LISTS):
    """All pairs of the given lists of data_root, in list order, duplicates dropped."""
    seen, pairs = set(), []
    for name in lists:
        for p in read_list(os.path.join(data_root, name)):
            if p[0] not in seen:
                seen.add(p[0])
                pairs.append(p)
    return pairs


def fold(pairs, holdout):
    """(train, val): val = the frames of sequence `holdout`, train = all others."""
    val = [p for p in pairs if sequence_of(p[0]) == holdout]
    train = [p for p in pairs if sequence_of(p[0]) != holdout]
    if not val:
        raise ValueError("no frames of sequence %r (sequences: %s)"
                         % (holdout, " ".join(sorted({sequence_of(p[0]) for p in pairs}))))
    return train, val


def write_list(path, pairs):
    """Writes `image label` lines relative to path's folder, atomically."""
    base = os.path.dirname(os.path.abspath(path))
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        for img, lab in pairs:
            f.write("%s %s\n" % (os.path.relpath(img, base), os.path.relpath(lab, base)))
    os.replace(tmp, path)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("data_root")
    ap.add_argument("out_dir", help="folder for xseq-<SEQ>/{train,val}.txt (keep it out of git: splits/ is ignored)")
    ap.add_argument("--holdout", action="append", default=None,
                    help="sequence to hold out (repeatable; default: one fold per sequence)")
    ap.add_argument("--lists", nargs="+", default=list(DEFAULT_LISTS),
                    help="list files of data_root that make the pool (default: train.txt val.txt)")
    args = ap.parse_args(argv)
    try:
        pairs = pool_pairs(args.data_root, args.lists)
    except OSError as e:
        print("make_splits: %s" % e, file=sys.stderr)
        return 1
    seqs = args.holdout or sorted({sequence_of(p[0]) for p in pairs})
    for seq in seqs:
        try:
            train, val = fold(pairs, seq)
        except ValueError as e:
            print("make_splits: %s: %s" % (args.data_root, e), file=sys.stderr)
            return 1
        d = os.path.join(args.out_dir, "xseq-%s" % seq)
        os.makedirs(d, exist_ok=True)
        write_list(os.path.join(d, "train.txt"), train)
        write_list(os.path.join(d, "val.txt"), val)
        print("%s: train %d, val %d (%s)" % (d, len(train), len(val), seq))
    return 0


if __name__ == "__main__":
    sys.exit(main())
