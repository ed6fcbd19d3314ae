#!/usr/bin/python3
"""Generate the golden test fixtures in tests/fixtures/ (deterministic).

  /usr/bin/python3 tools/gen_fixtures.py [--out tests/fixtures]

For each case: <case>.model.safetensors (a small random model file) and
<case>.golden.safetensors (every stage of the reference pipeline, computed in
float64 from the weights as stored in the model file, saved as F32; index
tensors as I32; image/mask as U8). tiny.model.safetensors is a copy of the
pad_resize model (short_side 40, so any image runs fast) for viewer/batch tests.

Weight seeds are searched (from a fixed start) so that every MiTA top-k
boundary and top-1 routing decision is at least GAP away from a tie; the
golden metadata records the gaps actually achieved, so C tests can justify
comparing routed sets / routes exactly. The final mask's smallest top-1 vs
top-2 logit gap is recorded too (mask_gap) but not enforced.

Self-checks (assert): the vectorised MiTA equals a naive per-query loop on
every layer of mita_d and pad_resize; with k = N (small_grid) it equals a dense
formula over all keys; the model file round-trips; the joint softmax equals
the log-sum-exp merge of the shared and routed partial softmaxes.
"""

import argparse
import json
import math
import os
import shutil
import sys

import numpy as np
import torch
import torch.nn as nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import mitaseg_ref as R  # noqa: E402
import safetensors_io  # noqa: E402

GAP = 1e-3
CLASSES = ["sky", "road", "car", "tree", "person"]
PALETTE = [[128, 128, 128], [128, 64, 128], [64, 0, 128], [128, 128, 0], [64, 64, 0]]


def base_cfg(**kw):
    cfg = {
        "backbone": {
            "patch_size": 8, "embed_dim": 24, "depth": 4, "num_heads": 2,
            "stem": {"type": "patch"}, "mlp_ratio": 4, "ln_eps": 1e-6,
            "pos_grid": [6, 7], "out_indices": [0, 1, 2, 3], "final_norm": False,
            "attention": {"type": "mita", "landmarks": [3, 3], "topk": 8, "shared_scale": "d"},
        },
        "neck": {"type": "mln", "out_channels": 8},
        "decoder": {"type": "uperhead", "channels": 8, "pool_scales": [1, 2, 3, 6], "bn_eps": 1e-5},
        "classes": CLASSES, "palette": PALETTE, "ignore_index": None,
        "input": {"mean": [123.675, 116.28, 103.53], "std": [58.395, 57.12, 57.375],
                  "short_side": None, "pad_multiple": 8},
        "provenance": "random weights for tests (tools/gen_fixtures.py)",
    }
    for path, v in kw.items():
        d = cfg
        keys = path.split("__")
        for k in keys[:-1]:
            d = d[k]
        d[keys[-1]] = v
    return cfg


# name, config, image (H, W), weight dtype, description
CASES = [
    ("mita_d", base_cfg(), (48, 56), "F32",
     "patch stem p8, grid 6x7, mln neck (level 3 = floor(7*0.5)), MiTA 3x3 k8, shared_scale d"),
    ("mita_sqrtd_conv", base_cfg(
        backbone__stem={"type": "conv", "channels": [8, 16, 16]}, backbone__pos_grid=[5, 10],
        backbone__final_norm=True,
        backbone__attention={"type": "mita", "landmarks": [3, 4], "topk": 10, "shared_scale": "sqrt_d"},
        neck={"type": "fpn-deconv"}), (40, 80), "F32",
     "conv stem p8 [8,16,16], grid 5x10, fpn-deconv neck, final_norm, MiTA 3x4 k10 sqrt_d"),
    ("full_none", base_cfg(
        backbone__pos_grid=[6, 7],
        backbone__attention={"type": "full", "landmarks": [3, 3], "topk": 8, "shared_scale": "d"},
        neck={"type": "none"}), (48, 56), "F32",
     "full attention, no neck (all levels at grid 6x7)"),
    ("posgrid", base_cfg(
        backbone__pos_grid=[8, 5],
        backbone__attention={"type": "mita", "landmarks": [4, 4], "topk": 12, "shared_scale": "d"}),
     (48, 48), "F32",
     "pos_grid 8x5 resized bicubic to the run grid 6x6, MiTA 4x4 k12"),
    ("small_grid", base_cfg(
        backbone__patch_size=16, backbone__stem={"type": "conv", "channels": [4, 8, 8, 16]},
        backbone__pos_grid=[3, 4],
        backbone__attention={"type": "mita", "landmarks": [7, 7], "topk": 49, "shared_scale": "sqrt_d"},
        input__pad_multiple=16), (48, 64), "F32",
     "conv stem p16 (4 convs), grid 3x4 < landmarks 7x7 (clamped to 3x4), k 49 clamped to N=12"),
    ("pad_resize", base_cfg(
        backbone__pos_grid=[6, 8], input__short_side=40, input__pad_multiple=16), (59, 77), "F32",
     "59x77 image, short_side 40 -> 40x52, padded to 48x64, grid 6x8; logits cropped and resized back"),
    ("f16", base_cfg(
        backbone__pos_grid=[5, 7],
        backbone__attention={"type": "mita", "landmarks": [3, 3], "topk": 6, "shared_scale": "sqrt_d"},
        neck={"type": "fpn-deconv"}), (40, 56), "F16",
     "weights stored F16 (golden computed from the F16-rounded weights), fpn-deconv, grid 5x7"),
    ("cls_mita", base_cfg(
        backbone__cls_token=True, backbone__pos_grid=[5, 7], backbone__final_norm=True),
     (48, 56), "F32",
     "class token, pos_grid 5x7 (+ class row) resized to the run grid 6x7, final_norm, "
     "MiTA 3x3 k8"),
    ("cls_full", base_cfg(
        backbone__cls_token=True, backbone__pos_grid=[6, 7],
        backbone__attention={"type": "full", "landmarks": [3, 3], "topk": 8, "shared_scale": "d"}),
     (48, 56), "F32", "class token, full attention, grid 6x7"),
    ("mmseg_pad", base_cfg(
        backbone__cls_token=True, backbone__pos_grid=[6, 8], input__short_side=40,
        input__pad_multiple=16, input__padded_logits="resize"), (59, 77), "F32",
     "mmseg test-time padding: 59x77 -> 40x52, padded to 48x64, head logits resized straight "
     "to 40x52 (no crop), then to 59x77; class token, MiTA 3x3 k8"),
    ("slide", base_cfg(
        backbone__cls_token=True, backbone__pos_grid=[4, 4],
        backbone__attention={"type": "full", "landmarks": [3, 3], "topk": 8, "shared_scale": "d"},
        input__short_side=40, input__pad_multiple=16, input__padded_logits="resize",
        input__slide={"crop": [24, 28], "stride": [16, 12]}), (59, 77), "F32",
     "mmseg slide_inference: 59x77 -> 40x52, 2x3 windows of 24x28 (strides 16, 12), each "
     "padded to 32x32, logits resized to the window, summed, divided by the count; full attention"),
    ("stem_skips", base_cfg(
        backbone__stem={"type": "conv", "channels": [8, 16, 12]}, backbone__pos_grid=[5, 10],
        backbone__attention={"type": "mita", "landmarks": [3, 4], "topk": 10, "shared_scale": "sqrt_d"},
        neck__stem_skips=2), (40, 80), "F32",
     "conv stem p8 [8,16,12], mln neck whose levels 0 and 1 add the stem's 1/2 and 1/4 "
     "outputs by 1x1 convs (neck.stem_skips), MiTA 3x4 k10 sqrt_d"),
]


# ------------------------------------------------------------------ inputs

def make_image(H, W, seed):
    """A deterministic synthetic RGB image: gradients, rectangles, noise."""
    g = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:H, 0:W].astype(np.float64)
    img = np.zeros((H, W, 3))
    for c in range(3):
        fy, fx, ph = g.uniform(0.02, 0.2), g.uniform(0.02, 0.2), g.uniform(0, 6.3)
        img[..., c] = 128 + 80 * np.sin(fy * yy + fx * xx + ph)
    for _ in range(6):
        y0, x0 = g.integers(0, H), g.integers(0, W)
        h, w = g.integers(H // 8 + 1, H // 2 + 2), g.integers(W // 8 + 1, W // 2 + 2)
        img[y0:y0 + h, x0:x0 + w] = g.uniform(0, 255, 3)
    img += g.normal(0, 10, img.shape)
    return np.clip(np.round(img), 0, 255).astype(np.uint8)


def randomise(model, seed):
    """Random weights that keep activations O(1); BN with positive running_var."""
    g = torch.Generator().manual_seed(seed)
    rn = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64)
    with torch.no_grad():
        for mod in model.modules():
            if isinstance(mod, (nn.Linear, nn.Conv2d)):
                fan_in = mod.weight[0].numel()
                gain = 1.5 if (isinstance(mod, nn.Linear) and mod.out_features == 3 * mod.in_features) else 1.0
                mod.weight.copy_(rn(*mod.weight.shape) * gain / math.sqrt(fan_in))
                if mod.bias is not None:
                    mod.bias.copy_(rn(*mod.bias.shape) * 0.1)
            elif isinstance(mod, nn.ConvTranspose2d):
                # kernel 2 stride 2: each output sees Cin inputs
                mod.weight.copy_(rn(*mod.weight.shape) / math.sqrt(mod.weight.shape[0]))
                mod.bias.copy_(rn(*mod.bias.shape) * 0.1)
            elif isinstance(mod, (nn.LayerNorm, nn.BatchNorm2d)):
                mod.weight.copy_(1 + 0.2 * rn(*mod.weight.shape))
                mod.bias.copy_(0.1 * rn(*mod.bias.shape))
                if isinstance(mod, nn.BatchNorm2d):
                    mod.running_mean.copy_(0.2 * rn(*mod.running_mean.shape))
                    u = torch.rand(mod.running_var.shape, generator=g, dtype=torch.float64)
                    mod.running_var.copy_(0.5 + 1.5 * u)
        model.backbone.pos_embed.copy_(0.5 * rn(*model.backbone.pos_embed.shape))
        if model.backbone.ncls:
            model.backbone.cls_token.copy_(rn(*model.backbone.cls_token.shape))


# ------------------------------------------------------------------ checks

def naive_mita(q, k, v, L, topk, shared_scale):
    """Per-head, per-query loop straight from spec section 2 (float64)."""
    h, N, d = q.shape
    M = L.shape[1]
    kk = min(topk, N)
    s = d ** -0.5
    s_sh = s if shared_scale == "d" else 1.0
    out = torch.zeros_like(q)
    for hh in range(h):
        P = L[hh] @ k[hh].T
        sets = [sorted(range(N), key=lambda n: (-P[m, n].item(), n))[:kk] for m in range(M)]
        Sv = torch.stack([torch.softmax(P[m] * s, 0) @ v[hh] for m in range(M)])
        for n in range(N):
            r = [(q[hh, n] @ L[hh, m]).item() for m in range(M)]
            e = max(range(M), key=lambda m: (r[m], -m))
            logits = [r[m] * s * s_sh for m in range(M)]
            logits += [(q[hh, n] @ k[hh, j]).item() * s for j in sets[e]]
            p = torch.softmax(torch.tensor(logits, dtype=torch.float64), 0)
            o = sum(p[m] * Sv[m] for m in range(M))
            o = o + sum(p[M + t] * v[hh, j] for t, j in enumerate(sets[e]))
            out[hh, n] = o
    return out


def layer_qkv(model, x_in, i):
    """q, k, v (h, N, d) and q tokens (N, C) of block i for tokens x_in (1, N, C)."""
    blk = model.backbone.blocks[i]
    y = blk.attn.qkv(blk.norm1(x_in))[0]
    C = y.shape[-1] // 3
    h = blk.attn.num_heads
    qt, kt, vt = y.split(C, -1)
    hd = lambda t: t.reshape(-1, h, C // h).transpose(0, 1)
    return hd(qt), hd(kt), hd(vt), qt


def check_layers(model, stages, grid, att, dense_all=False):
    """Vectorised MiTA vs the naive loop (and vs a dense formula when k >= N).
    With a class token the naive loop sees it as one more key and query (spec
    2.7); only the landmarks leave it out."""
    nc = model.backbone.ncls
    for i in range(len(model.backbone.blocks)):
        if "blocks.%d" % i not in stages:
            break
        x_in = stages["embed"] if i == 0 else stages["blocks.%d" % (i - 1)]
        q, k, v, qt = layer_qkv(model, x_in, i)
        L, _ = R.mita_landmarks(qt[nc:].unsqueeze(0), grid, att["landmarks"], q.shape[0])
        vec = R.attention_mita(q[None], k[None], v[None], L, att["topk"], att["shared_scale"],
                               ncls=nc)[0]
        if dense_all:
            assert att["topk"] >= q.shape[1]
            d = q.shape[-1]
            s = d ** -0.5
            s_sh = s if att["shared_scale"] == "d" else 1.0
            P = L[0] @ k.transpose(-1, -2)
            Sv = torch.softmax(P * s, -1) @ v
            a = q @ L[0].transpose(-1, -2) * s * s_sh
            b = q @ k.transpose(-1, -2) * s
            p = torch.softmax(torch.cat([a, b], -1), -1)
            ref = p[..., :a.shape[-1]] @ Sv + p[..., a.shape[-1]:] @ v
        else:
            ref = naive_mita(q, k, v, L[0], att["topk"], att["shared_scale"])
        err = (vec - ref).abs().max().item()
        assert err < 1e-10, "MiTA layer %d: vectorised vs reference differ by %g" % (i, err)
        # joint softmax == log-sum-exp merge of the two partial softmaxes
        if i == 0 and nc == 0:
            rec = {}
            R.attention_mita(q[None], k[None], v[None], L, att["topk"], att["shared_scale"], rec)
            e, idx = rec["route"][0], rec["topk_idx"][0]
            hh, n = 0, 0
            d = q.shape[-1]
            s = d ** -0.5
            s_sh = s if att["shared_scale"] == "d" else 1.0
            a = rec["routing"][0, hh, n] * s * s_sh
            sel = idx[hh, e[hh, n]]
            b = (k[hh, sel] @ q[hh, n]) * s
            Sv = torch.softmax(rec["probe"][0, hh] * s, -1) @ v[hh]
            o1 = torch.softmax(a, 0) @ Sv
            o2 = torch.softmax(b, 0) @ v[hh, sel]
            la, lb = torch.logsumexp(a, 0), torch.logsumexp(b, 0)
            w = torch.softmax(torch.stack([la, lb]), 0)
            merged = w[0] * o1 + w[1] * o2
            assert (merged - vec[hh, n]).abs().max().item() < 1e-10, "LSE merge check failed"


def gaps(stages, depth, N):
    """Smallest top-k boundary, top-k order and top-1 routing gaps over all layers."""
    tb, to, rg = math.inf, math.inf, math.inf
    for i in range(depth):
        key = "layers.%d.probe" % i
        if key not in stages:
            continue
        P = stages[key][0]
        k = stages["layers.%d.topk_idx" % i].shape[-1]
        sp = torch.sort(P, -1, descending=True).values
        if k < N:
            tb = min(tb, (sp[..., k - 1] - sp[..., k]).min().item())
        if k > 1:
            to = min(to, (sp[..., :k - 1] - sp[..., 1:k]).min().item())
        Rm = stages["layers.%d.routing" % i][0]
        if Rm.shape[-1] > 1:
            sr = torch.sort(Rm, -1, descending=True).values
            rg = min(rg, (sr[..., 0] - sr[..., 1]).min().item())
    return tb, to, rg


# ------------------------------------------------------------------ cases

def stored_model(name, cfg, seed, wdtype, desc, model_path, img):
    """A random model written to model_path and read back in float64 (the
    golden comes from the stored weights), and its stages on img."""
    model = R.MitaSeg(cfg).double().eval()
    randomise(model, seed)
    R.save_model(model, model_path, dtype=wdtype, provenance="random weights for tests "
                 "(tools/gen_fixtures.py case %s, seed %d): %s" % (name, seed, desc))
    model = R.load_model(model_path, dtype=torch.float64)
    stages = {}
    with torch.no_grad():
        R.segment(model, img, stages=stages)
    return model, stages


def run_slide_case(name, cfg, size, wdtype, desc, out_dir, seed0):
    """Sliding windows: only the image, the final logits and the mask are
    golden (the engine traces every window under the same stage names)."""
    img = make_image(size[0], size[1], seed0 + 7)
    model_path = os.path.join(out_dir, name + ".model.safetensors")
    model, stages = stored_model(name, cfg, seed0, wdtype, desc, model_path, img)
    with torch.no_grad():
        # the windows really overlap and are averaged: differs from one whole run
        _, whole = R.segment(model, img, whole=True)
    assert (whole - stages["logits"][0]).abs().max().item() > 1e-3
    logits = stages["logits"][0]
    top2 = torch.topk(logits, 2, dim=0).values
    mask_gap = (top2[0] - top2[1]).min().item()
    g = {"image": torch.as_tensor(img), "logits": logits.to(torch.float32).contiguous(),
         "mask": stages["mask"][0].to(torch.uint8)}
    meta = {"case": name, "description": desc, "model": name + ".model.safetensors",
            "weights": wdtype, "seed": str(seed0), "attention": "full", "slide": "yes",
            "mask_gap": "%.6g" % mask_gap}
    safetensors_io.save(os.path.join(out_dir, name + ".golden.safetensors"), g, meta)
    print("  %-16s seed %d sliding windows, mask gap %.6g" % (name, seed0, mask_gap))


def run_case(name, cfg, size, wdtype, desc, out_dir, seed0):
    if cfg["input"].get("slide"):
        return run_slide_case(name, cfg, size, wdtype, desc, out_dir, seed0)
    img = make_image(size[0], size[1], seed0 + 7)
    model_path = os.path.join(out_dir, name + ".model.safetensors")
    best = None
    for attempt in range(60):
        seed = seed0 + attempt
        model, stages = stored_model(name, cfg, seed, wdtype, desc, model_path, img)
        N = stages["embed"].shape[1]
        tb, to, rg = gaps(stages, cfg["backbone"]["depth"], N)
        ok = tb >= GAP and rg >= GAP
        score = min(tb, rg)
        if best is None or score > best[0]:
            best = (score, seed)
        if ok:
            break
    else:
        # fall back to the best seed seen
        seed = best[1]
        model, stages = stored_model(name, cfg, seed, wdtype, desc, model_path, img)
        N = stages["embed"].shape[1]
        tb, to, rg = gaps(stages, cfg["backbone"]["depth"], N)
        print("  warning: %s: no seed met the gap %g (best %g)" % (name, GAP, min(tb, rg)))

    att = R.resolve_attention(model.cfg["backbone"]["attention"], None)
    grid = tuple(stages["taps.0"].shape[-2:])
    with torch.no_grad():
        if name in ("mita_d", "pad_resize", "cls_mita"):
            check_layers(model, stages, grid, att)
        if name == "small_grid":
            check_layers(model, stages, grid, att, dense_all=True)

    # file round-trip: weights read back equal what the golden used
    tensors, meta = safetensors_io.load(model_path)
    for k, v in R.model_tensors(model).items():
        assert np.array_equal(np.asarray(tensors[k], dtype=np.float64), v.numpy()), k

    logits = stages["logits"][0]
    if model.cfg["input"].get("padded_logits") == "resize":
        # mmseg's padding behaviour really differs from the crop
        H, W = img.shape[:2]
        crop, _ = R.postprocess(stages["head.logits"], stages["input"].shape[-2:],
                                R.working_size(H, W, model.cfg), (H, W), "crop")
        assert (crop[0] - logits).abs().max().item() > 1e-2
    top2 = torch.topk(logits, 2, dim=0).values if logits.shape[0] > 1 else None
    mask_gap = (top2[0] - top2[1]).min().item() if top2 is not None else math.inf

    g = {}
    f32 = lambda t: t.detach().to(torch.float32).contiguous()
    g["image"] = torch.as_tensor(img)
    g["input"] = f32(stages["input"][0])
    g["pos_embed"] = f32(stages["pos_embed"][0])
    g["embed"] = f32(stages["embed"][0])
    depth = cfg["backbone"]["depth"]
    for i in range(depth):
        if "blocks.%d" % i in stages:
            g["blocks.%d" % i] = f32(stages["blocks.%d" % i][0])
        if "layers.%d.probe" % i in stages:
            g["layers.%d.topk_idx" % i] = stages["layers.%d.topk_idx" % i][0].to(torch.int32)
            g["layers.%d.route" % i] = stages["layers.%d.route" % i][0].to(torch.int32)
            g["layers.%d.probe" % i] = f32(stages["layers.%d.probe" % i][0])
            g["layers.%d.routing" % i] = f32(stages["layers.%d.routing" % i][0])
    for j in range(4):
        g["taps.%d" % j] = f32(stages["taps.%d" % j][0])
        g["neck.%d" % j] = f32(stages["neck.%d" % j][0])
    g["head.psp"] = f32(stages["head.psp"][0])
    for l in range(3):
        g["head.fpn.%d" % l] = f32(stages["head.fpn.%d" % l][0])
    g["head.fused"] = f32(stages["head.fused"][0])
    g["head.logits"] = f32(stages["head.logits"][0])
    g["logits"] = f32(logits)
    g["mask"] = stages["mask"][0].to(torch.uint8)

    if att["type"] == "mita":
        gh, gw, k = stages["layers.0.grid"]
        lm, tk = "%dx%d" % (gh, gw), str(k)
    else:
        lm, tk = "", ""
    fmt = lambda x: "inf" if math.isinf(x) else "%.6g" % x
    meta = {"case": name, "description": desc, "model": name + ".model.safetensors",
            "weights": wdtype, "seed": str(seed), "attention": att["type"], "landmarks": lm,
            "topk": tk, "topk_boundary_gap": fmt(tb), "topk_order_gap": fmt(to),
            "route_gap": fmt(rg), "mask_gap": fmt(mask_gap),
            "grid": "%dx%d" % grid}
    safetensors_io.save(os.path.join(out_dir, name + ".golden.safetensors"), g, meta)
    print("  %-16s seed %d grid %s lm %s k %s gaps: boundary %s order %s route %s mask %s" % (
        name, seed, meta["grid"], lm or "-", tk or "-", fmt(tb), fmt(to), fmt(rg), fmt(mask_gap)))
    if name in TTA_CASES:
        write_tta_golden(model, img, name, out_dir)


# Flip TTA goldens (<case>.tta.golden.safetensors): pad_resize's odd size,
# resize and right/bottom padding make the mirror pass see other pixels at
# the border than the unflipped one.
TTA_CASES = ("pad_resize",)


def write_tta_golden(model, img, name, out_dir):
    """image, logits (K,H,W) and mask of segment(tta="flip") in float64, and of
    the mirror image (flip-equivariance is checked here: exactly, in float64)."""
    with torch.no_grad():
        mask, logits = R.segment(model, img, tta="flip")
        mask_m, logits_m = R.segment(model, np.ascontiguousarray(img[:, ::-1]), tta="flip")
    assert torch.allclose(logits_m, logits.flip(-1), rtol=0, atol=1e-12)
    top2 = torch.topk(logits, 2, dim=0).values
    f32 = lambda t: t.detach().to(torch.float32).contiguous()
    g = {"image": torch.as_tensor(img), "logits": f32(logits), "mask": mask.to(torch.uint8)}
    meta = {"case": name, "tta": "flip", "model": name + ".model.safetensors",
            "mask_gap": "%.6g" % (top2[0] - top2[1]).min().item()}
    safetensors_io.save(os.path.join(out_dir, name + ".tta.golden.safetensors"), g, meta)
    print("  %-16s flip TTA golden, mask gap %s" % (name, meta["mask_gap"]))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    here = os.path.dirname(os.path.abspath(__file__))
    ap.add_argument("--out", default=os.path.join(here, "..", "tests", "fixtures"))
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    torch.set_num_threads(1)
    for ci, (name, cfg, size, wdtype, desc) in enumerate(CASES):
        run_case(name, cfg, size, wdtype, desc, args.out, seed0=1000 * (ci + 1))
    shutil.copyfile(os.path.join(args.out, "pad_resize.model.safetensors"),
                    os.path.join(args.out, "tiny.model.safetensors"))
    total = sum(os.path.getsize(os.path.join(args.out, f)) for f in os.listdir(args.out)
                if f.endswith(".safetensors"))
    print("wrote %d cases + tiny.model.safetensors to %s (%.2f MB)" % (len(CASES), args.out, total / 1e6))
    return 0


if __name__ == "__main__":
    sys.exit(main())
