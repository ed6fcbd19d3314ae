#!/usr/bin/python3
"""Seed corpora for the libFuzzer harnesses (tests/fuzz/run.sh), made fresh
rather than committed:

  /usr/bin/python3 tests/fuzz/make_corpus.py OUT_DIR

OUT_DIR/model: micro models (20-40 KB: patch and conv stems, every neck, full
and MiTA attention, F32/F16/BF16 weights; tools/gen_fixtures.py's config
shrunk, random weights from tools/mitaseg_ref.py); OUT_DIR/image: PNGs of
every colour type and bit depth (palette with transparency, 16-bit, 1-bit),
JPEGs (baseline, progressive, grey, CMYK, EXIF-rotated) and label PNGs
(8-bit grey, palette, 2-bit). Needs numpy and PIL; PyTorch for the micro
models (without it the test fixtures seed the model corpus).
"""
import glob
import os
import shutil
import sys

import numpy as np
from PIL import Image

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..", "..")
PALETTE = [[128, 128, 128], [128, 64, 128], [64, 0, 128]]  # label PNGs


def micro_cfg(base_cfg, **kw):
    """gen_fixtures' test config shrunk to a few KB of weights, then kw."""
    small = dict(backbone__patch_size=4, backbone__embed_dim=8, backbone__pos_grid=[2, 3],
                 backbone__attention={"type": "mita", "landmarks": [2, 2], "topk": 3},
                 neck={"type": "mln", "out_channels": 4},
                 decoder={"type": "uperhead", "channels": 4, "pool_scales": [1, 2]},
                 input={"short_side": 12, "pad_multiple": 4})
    small.update(kw)
    return base_cfg(**small)


def models(out):
    os.makedirs(out, exist_ok=True)
    try:
        import torch
        sys.path.insert(0, os.path.join(ROOT, "tools"))
        import mitaseg_ref as R
        from gen_fixtures import base_cfg
    except ImportError as e:
        # The fixtures are valid seeds too, only larger (slower to mutate).
        print("note: no micro models (%s); seeding with the test fixtures" % e)
        for f in glob.glob(os.path.join(ROOT, "tests", "fixtures", "*.model.safetensors")):
            shutil.copy(f, out)
        return
    torch.manual_seed(7)
    cases = {
        "patch_mln_mita": (micro_cfg(base_cfg), "F32"),
        "conv_fpn_f16": (micro_cfg(base_cfg, backbone__stem={"type": "conv", "channels": [4, 8]},
                                   neck={"type": "fpn-deconv"}), "F16"),
        "full_none_bf16": (micro_cfg(base_cfg, backbone__attention={"type": "full"},
                                     neck={"type": "none"}, backbone__final_norm=True), "BF16"),
        "native_size": (micro_cfg(base_cfg, input={"short_side": None, "pad_multiple": 8}), "F32"),
    }
    for name, (cfg, dt) in cases.items():
        model = R.MitaSeg(cfg).eval()
        R.save_model(model, os.path.join(out, name + ".safetensors"), dtype=dt)


def images(out):
    os.makedirs(out, exist_ok=True)
    g = np.random.default_rng(3)
    rgb = g.integers(0, 256, (9, 13, 3), dtype=np.uint8)
    im = Image.fromarray(rgb, "RGB")
    im.save(os.path.join(out, "rgb8.png"))
    Image.fromarray(np.dstack([rgb, rgb[..., :1]]), "RGBA").save(os.path.join(out, "rgba8.png"))
    im.convert("L").save(os.path.join(out, "grey8.png"))
    im.convert("LA").save(os.path.join(out, "greya8.png"))
    im.convert("1").save(os.path.join(out, "grey1.png"))
    Image.fromarray((rgb[..., 0].astype(np.uint16) * 257), "I;16").save(os.path.join(out, "grey16.png"))
    p = im.convert("P", palette=Image.ADAPTIVE, colors=8)
    p.save(os.path.join(out, "palette8.png"), transparency=0)
    p.save(os.path.join(out, "palette4.png"), bits=4)
    im.save(os.path.join(out, "baseline.jpg"), quality=80)
    im.save(os.path.join(out, "progressive.jpg"), quality=80, progressive=True)
    im.convert("L").save(os.path.join(out, "grey.jpg"))
    im.convert("CMYK").save(os.path.join(out, "cmyk.jpg"))
    exif = Image.Exif()
    exif[0x0112] = 6  # rotated 90 degrees
    im.save(os.path.join(out, "exif6.jpg"), exif=exif.tobytes())
    lab = g.integers(0, 4, (9, 13), dtype=np.uint8)
    Image.fromarray(lab, "L").save(os.path.join(out, "label_grey.png"))
    lp = Image.fromarray(lab, "P")
    lp.putpalette(sum(PALETTE, []) + [0, 0, 0] * 253)
    lp.save(os.path.join(out, "label_palette.png"))
    lp.save(os.path.join(out, "label_palette2.png"), bits=2)


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "corpus"
    models(os.path.join(out, "model"))
    images(os.path.join(out, "image"))
    for d in ("model", "image"):
        print("%s: %d seeds" % (d, len(os.listdir(os.path.join(out, d)))))


if __name__ == "__main__":
    main()
