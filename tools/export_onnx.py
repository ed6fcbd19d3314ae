#!/usr/bin/python3
"""Export a mitaseg model file to ONNX through the PyTorch reference
(tools/mitaseg_ref.py), for one image size, batch 1.

  /usr/bin/python3 tools/export_onnx.py MODEL.safetensors OUT.onnx --size WxH \\
      [--attention mita|full] [--landmarks GHxGW --topk K] [--input tensor|image] \\
      [--check [--image IMG] [--dump D.safetensors]]

--size is the image size, width x height as everywhere in mitaseg.
--input tensor (default): the graph's input "input" is the preprocessed image
  (1, 3, ph, pw) float32: normalised and zero-padded, what mitaseg_ref.preprocess
  returns. --input image: "image" is the raw RGB image (H, W, 3) uint8 and the
  preprocessing is in the graph (what bench/bench_cpu.py times, so every
  contender does the same work from pixels to mask).
Outputs: "logits" (1, classes, H, W) float32 at the image size, before argmax,
and "mask" (1, H, W) uint8 (first maximum), as mitaseg's --dump has them.

The exporter (torch.onnx.export of torch 1.13, opset 17) traces the reference
with mitaseg_ref.EXPORT_ONNX set: MiTA's stable descending sort becomes
torch.topk (ONNX TopK; which of two exactly tied keys it keeps is
unspecified), and adaptive average pooling to a size that does not divide
the input (MiTA's landmarks, the PPM) becomes window sums by constant 0/1
matrices over the same windows. The landmarks then differ from the exact
pooling's in the last bit, which can flip a query's top-1 route where two
experts nearly tie: measured on the DeiT-Tiny-sized bench model at 512x512
(random weights), one query in each of two layers, logits 2e-4 relative,
masks 99.997 % equal (torch.topk alone changes nothing there); the CamVid
model on a CamVid frame agrees to 6e-7, masks 100 %.

--check validates the file (onnx.checker) and runs it with ONNX Runtime (so
run this script with the python of build-bench-venv/, made by
tools/ort_venv.py) on --image (default:
random pixels) and prints the logits' relative error (max |a - b| / max |b|)
and mask agreement against the reference, and against mitaseg's
`segment --dump` logits with --dump; it exits 1 if the error is above --tol.
"""

import argparse
import os
import sys
import warnings

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import mitaseg_ref as R  # noqa: E402
import safetensors_io  # noqa: E402
from ort_venv import rel_error, session  # noqa: E402

OPSET = 17   # the newest torch 1.13's exporter writes


class Exported(torch.nn.Module):
    """Reference pipeline for one image size, from the image or the
    preprocessed tensor to (logits, mask) at the image size."""

    def __init__(self, model, size_hw, attn, from_image):
        super().__init__()
        self.model, self.size_hw, self.attn, self.from_image = model, size_hw, attn, from_image
        self.resized = R.working_size(size_hw[0], size_hw[1], model.cfg)

    def forward(self, x):
        if self.from_image:
            x, _ = R.preprocess(x, self.model.cfg, x.new_zeros(()).float().dtype)
        head = self.model(x, attn=self.attn)
        logits, mask = R.postprocess(head, x.shape[-2:], self.resized, self.size_hw)
        return logits, mask


def parse_pair(text, what):
    try:
        a, b = (int(v) for v in text.lower().split("x"))
    except ValueError:
        raise SystemExit("export_onnx: %s: expected AxB, got '%s'" % (what, text))
    if a < 1 or b < 1:
        raise SystemExit("export_onnx: %s: sizes must be positive, got '%s'" % (what, text))
    return a, b


def attn_override(attention, landmarks, topk):
    """The run-time attention override, as mitaseg's --attention/--landmarks/--topk."""
    attn = {}
    if attention:
        attn["type"] = attention
    if landmarks:
        attn["landmarks"] = list(parse_pair(landmarks, "--landmarks"))
    if topk is not None:
        attn["topk"] = topk
    return attn or None


def export(model, out_path, size_wh, attn=None, from_image=False):
    """Writes the ONNX file; returns the example input it was traced with
    (a uint8 image or the preprocessed tensor of a zero image)."""
    w, h = size_wh
    net = Exported(model, (h, w), attn, from_image).eval()
    image = torch.zeros(h, w, 3, dtype=torch.uint8)
    example = image if from_image else R.preprocess(image, model.cfg)[0]
    tmp = out_path + ".tmp"
    R.EXPORT_ONNX = True
    try:
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")   # TracerWarnings: sizes are fixed on purpose
            torch.onnx.export(net, (example,), tmp, opset_version=OPSET, do_constant_folding=True,
                              input_names=["image" if from_image else "input"],
                              output_names=["logits", "mask"])
        os.replace(tmp, out_path)   # never a half-written OUT.onnx
    finally:
        R.EXPORT_ONNX = False
        if os.path.exists(tmp):
            os.remove(tmp)
    return example


def run_onnx(path, feed, threads=1):
    """(logits, mask) from ONNX Runtime."""
    sess = session(path, threads)
    logits, mask = sess.run(None, {sess.get_inputs()[0].name: feed})
    return logits, mask


def load_image(path, size_wh, seed=12345):
    """RGB uint8 (H, W, 3): the file (must have the export size) or random pixels."""
    w, h = size_wh
    if not path:
        return np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8)
    from PIL import Image
    img = np.array(Image.open(path).convert("RGB"))   # writable: torch warns otherwise
    if img.shape[:2] != (h, w):
        raise SystemExit("export_onnx: %s: image is %dx%d, the export is for %dx%d"
                         % (path, img.shape[1], img.shape[0], w, h))
    return img


def check(model, onnx_path, img, attn, from_image, dump=None):
    """Compares the ONNX model with the reference (and a mitaseg dump).
    Returns {name: (relative error, mask agreement %)}."""
    import onnx
    onnx.checker.check_model(onnx_path, full_check=True)   # well-formed, shapes infer
    with torch.no_grad():
        ref_mask, ref_logits = R.segment(model, img, attn=attn)
        feed = img if from_image else R.preprocess(img, model.cfg)[0].numpy()
    logits, mask = run_onnx(onnx_path, feed)
    out = {"reference": (rel_error(logits[0], ref_logits.numpy()),
                         100.0 * float(np.mean(mask[0] == ref_mask.numpy())))}
    if dump:
        t, _ = safetensors_io.load(dump)
        d_logits = np.asarray(t["logits"]).reshape(logits.shape)
        d_mask = np.asarray(t["mask"]).reshape(mask.shape)
        out["mitaseg"] = (rel_error(logits, d_logits), 100.0 * float(np.mean(mask == d_mask)))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model", help="mitaseg model file (.safetensors)")
    ap.add_argument("output", help="ONNX file to write")
    ap.add_argument("--size", required=True, help="image size WxH")
    ap.add_argument("--attention", choices=["mita", "full"], default=None,
                    help="attention to export (default: the model's)")
    ap.add_argument("--landmarks", default=None, help="MiTA landmark grid GHxGW")
    ap.add_argument("--topk", type=int, default=None, help="MiTA routed keys per expert")
    ap.add_argument("--input", choices=["tensor", "image"], default="tensor")
    ap.add_argument("--check", action="store_true", help="compare with the reference (needs onnxruntime)")
    ap.add_argument("--image", default=None, help="image for --check (default: random pixels)")
    ap.add_argument("--dump", default=None, help="mitaseg segment --dump file of that image, for --check")
    ap.add_argument("--tol", type=float, default=1e-3, help="largest relative error --check accepts")
    args = ap.parse_args()
    size = parse_pair(args.size, "--size")
    if args.topk is not None and args.topk < 1:
        raise SystemExit("export_onnx: --topk must be positive")
    if os.path.abspath(args.output) == os.path.abspath(args.model):
        raise SystemExit("export_onnx: %s: output would overwrite the model" % args.output)
    try:
        model = R.load_model(args.model)
    except (OSError, ValueError, KeyError) as e:
        raise SystemExit("export_onnx: %s: %s" % (args.model, e))
    attn = attn_override(args.attention, args.landmarks, args.topk)
    from_image = args.input == "image"
    export(model, args.output, size, attn, from_image)
    print("wrote %s (opset %d, %s input, %dx%d)" % (args.output, OPSET, args.input, size[0], size[1]))
    if args.check:
        img = load_image(args.image, size)
        worst = 0.0
        for name, (err, agree) in check(model, args.output, img, attn, from_image, args.dump).items():
            print("ONNX Runtime vs %s: logits relative error %.2e, masks %.3f %% equal"
                  % (name, err, agree))
            worst = max(worst, err)
        if worst > args.tol:
            print("export_onnx: relative error %.2e is above --tol %.0e" % (worst, args.tol),
                  file=sys.stderr)
            sys.exit(1)


if __name__ == "__main__":
    main()
