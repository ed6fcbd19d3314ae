"""Goldens for mitaseg's OpenCV-exact uint8 resize (app/image_resize.c,
input.resize "cv2_uint8"), produced by OpenCV itself: cv2.resize(...,
INTER_LINEAR) on random 3-channel uint8 images, as mmcv.imresize calls it.

    .venv-upstream/bin/python tools/tests/gen_resize_golden.py OUT.safetensors [--many]

writes tensors src.I (h, w, 3) and dst.I.J (dh, dw, 3), all U8, which
tests/test_image_resize.c resizes and compares byte for byte
(MS_RESIZE_GOLDEN=OUT selects a file other than the fixture). The default
set is tests/fixtures/cv2_resize.golden.safetensors (small: edge cases);
--many is the larger sweep tools/tests/test_upstream.py runs.
"""

import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import safetensors_io  # noqa: E402


def keep_ratio(h, w, short, long=None):
    """mmcv.rescale_size's size for scale (long, short)."""
    s = short / min(h, w)
    if long:
        s = min(long / max(h, w), s)
    return int(h * s + 0.5), int(w * s + 0.5)


def targets(h, w):
    """Output sizes that exercise every branch: copies, one axis only, the
    exact 2x reduction (OpenCV's area mean), 1-pixel outputs, integer and odd
    up/down ratios, and mmcv keep-ratio sizes."""
    t = {(h, w), (1, 1), (1, w), (h, 1), (h, w + 1), (h + 1, w), (2 * h, 2 * w), (3 * h, 2 * w + 1),
         (max(1, h // 2), max(1, w // 2)), (max(1, h * 2 // 3), max(1, w * 3 // 7)),
         (h * 5 // 3 + 1, w * 7 // 4 + 2), (max(1, h - 1), w + 3), (13, 17), (4, 3)}
    if h % 2 == 0 and w % 2 == 0:
        t.add((h // 2, w // 2))                      # exactly half: area path
    t.add(keep_ratio(h, w, 72 if min(h, w) > 8 else 9))
    t.add(keep_ratio(h, w, 31, 40))
    return sorted(t)


def cases(many=False, seed=0):
    import cv2
    g = np.random.default_rng(seed)
    srcs = [(1, 1), (1, 7), (7, 1), (2, 2), (5, 9), (23, 37), (34, 50)]
    if many:
        srcs += [(70, 100), (3, 2), (9, 5), (16, 16), (17, 33), (48, 64), (64, 48), (101, 67), (120, 160),
                 (360, 480)]
    out = {}
    for i, (h, w) in enumerate(srcs):
        img = g.integers(0, 256, (h, w, 3), dtype=np.uint8)
        if h * w > 64:   # smooth regions too, where rounding ties are common
            yy, xx = np.mgrid[0:h, 0:w]
            img[: h // 2] = ((yy[: h // 2, :, None] * 7 + xx[: h // 2, :, None] * 3
                              + np.arange(3)) % 256).astype(np.uint8)
        out["src.%d" % i] = img
        tg = targets(h, w)
        if many:
            tg += [(max(1, int(h * f)), max(1, int(w * f2)))
                   for f, f2 in ((0.37, 0.61), (1.37, 0.73), (2.5, 3.25), (0.125, 0.2), (4.1, 1.0))]
        for j, (dh, dw) in enumerate(sorted(set(tg))):
            out["dst.%d.%d" % (i, j)] = cv2.resize(img, (dw, dh), interpolation=cv2.INTER_LINEAR)
    return out, cv2.__version__


def main(argv):
    if not argv or argv[0].startswith("-"):
        print(__doc__, file=sys.stderr)
        return 2
    t, ver = cases(many="--many" in argv)
    safetensors_io.save(argv[0], t, {"producer": "cv2.resize INTER_LINEAR, opencv %s" % ver})
    print("%s: %d resizes (opencv %s)" % (argv[0], sum(k.startswith("dst.") for k in t), ver))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
