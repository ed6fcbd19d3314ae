#!/usr/bin/python3
"""Export a tools/train.py checkpoint to a mitaseg model file (model-format.md).

  /usr/bin/python3 tools/export.py /work/runs/camvid-mita/best.pt camvid-mita.safetensors \
      [--dtype F16|F32|BF16] [--log /work/runs/camvid-mita/log.txt] [--provenance TEXT]

Weights default to F16 (the shipped model stays well under 50 MB). The
auxiliary head is training-only and is not exported. Unless --provenance is
given, the provenance string is built from the checkpoint and the run's
log.txt (data, epochs, val mIoU/aAcc).
"""

import argparse
import os
import re
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import convert  # noqa: E402
import mitaseg_ref as R  # noqa: E402


def last_val(log_path):
    """(epoch, mIoU, aAcc) of the last logged validation, or None."""
    if not log_path or not os.path.exists(log_path):
        return None
    found = None
    pat = re.compile(r"^epoch (\d+)/\d+ .* val mIoU ([\d.]+) aAcc ([\d.]+)")
    with open(log_path) as f:
        for line in f:
            m = pat.match(line)
            if m:
                found = (int(m.group(1)), float(m.group(2)), float(m.group(3)))
    return found


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("checkpoint", help="best.pt or last.pt from tools/train.py")
    ap.add_argument("output", help="model file to write (.safetensors)")
    ap.add_argument("--dtype", default="F16", choices=["F16", "F32", "BF16"])
    ap.add_argument("--log", default=None, help="log.txt of the run (default: next to the checkpoint)")
    ap.add_argument("--provenance", default=None)
    ap.add_argument("--raw", action="store_true",
                    help="last.pt of an EMA run: export the raw weights, not the EMA ones")
    args = ap.parse_args()

    ck = convert.load_checkpoint(args.checkpoint)   # weights_only=False (PyTorch >= 2.6 default)
    cfg = R.complete_config(ck["model_config"])
    model = R.MitaSeg(cfg)
    # last.pt of a run with weight EMA holds both; the EMA weights are the
    # ones validated (best.pt holds only those, as "model")
    use_ema = ck.get("ema") is not None and not args.raw
    model.load_state_dict(ck["ema"] if use_ema else ck["model"])
    model.eval()

    prov = args.provenance
    if prov is None:
        log = args.log or os.path.join(os.path.dirname(os.path.abspath(args.checkpoint)), "log.txt")
        epoch = ck.get("epoch")
        if "val_miou" in ck:
            score = "val mIoU %.2f, aAcc %.2f" % (ck["val_miou"], ck["val_aacc"])
        else:
            lv = last_val(log)
            score = ("val mIoU %.2f, aAcc %.2f (epoch %d)" % (lv[1], lv[2], lv[0])) if lv else "not validated"
        att = cfg["backbone"]["attention"]
        data = ck.get("data")
        if data:
            data = "CamVid 11-class %s" % data
            where = "(at the model's working size)"
        else:
            data = "CamVid 11-class train split (367 images)"
            where = "on CamVid val (101 images) at 360x480"
        init = ck.get("init")
        start = ("Started from %s (no other pretraining), trained" % os.path.basename(init) if init
                 else "Trained from scratch (no pretraining)")
        prov = ("%s on %s with tools/train.py (%s), %s epochs, "
                "MiTA attention %dx%d landmarks k=%d during training%s; %s %s; exported with "
                "tools/export.py (%s weights)." % (
                    start, data, os.path.basename(ck.get("config_path", "?")), epoch,
                    att["landmarks"][0], att["landmarks"][1], att["topk"],
                    ", weight EMA" if use_ema or ck.get("train_config", {}).get("ema") else "",
                    score, where, args.dtype))
    R.save_model(model, args.output, dtype=args.dtype, provenance=prov)
    size = os.path.getsize(args.output)
    print("wrote %s (%.1f MB, %s): %s" % (args.output, size / 1e6, args.dtype, prov))
    # round-trip check: the file loads and gives the same logits as the checkpoint
    re_model = R.load_model(args.output)
    x = torch.randn(1, 3, 64, 96)
    with torch.no_grad():
        a = model(x)
        b = re_model(x)
    err = (a - b).abs().max().item()
    print("round-trip max |logit diff| = %.3g" % err)
    return 0


if __name__ == "__main__":
    sys.exit(main())
