#!/usr/bin/python3
"""Import public checkpoints into mitaseg naming, by renaming only.

  convert.py timm  IN.pth OUT.pt   [--num-heads H] [--pos-grid HxW]
      timm / DeiT / MiTA-DeiT ViT backbone -> a .pt file
      {"state_dict": {backbone.* tensors}, "backbone_config": {...}, "source": IN}
      to initialise training (see init_backbone(), for tools/train.py).
      The class token, the distillation token and their position-embedding
      slots are dropped; the classifier head is dropped.

  convert.py mmseg IN.pth OUT.safetensors [flags]
      mmsegmentation UperNet with a ViT/DeiT backbone (MultiLevelNeck or no
      neck) -> a complete model file (docs/model-format.md) that mitaseg runs.
      Config inferred from tensor shapes; what shapes cannot tell comes from
      flags (--num-heads, --attention, --landmarks, --topk, --shared-scale,
      --classes, --palette, --short-side, --out-indices, --ln-eps, --dtype).

What renaming cannot carry over (mmseg): our models have no class token, so
the converted model equals mmseg's VisionTransformer with with_cls_token=False;
a checkpoint trained with the class token inside the encoder (mmseg's default)
runs without it, which shifts its outputs slightly. The MultiLevelNeck must
use scales [4, 2, 1, 0.5] (mmseg's UperNet-ViT configs), the ViT no pre_norm,
no patch_norm, no LayerScale; anything else stops with an error.

Checkpoints are Python pickles (torch.load): convert only files you trust.
Errors are one line naming the file and the first key that does not fit.
"""

import argparse
import json
import math
import os
import re
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import mitaseg_ref as R  # noqa: E402


class ConvertError(Exception):
    """A checkpoint this converter does not understand; message names the file."""


# ---------------------------------------------------------------- loading

def load_checkpoint(path):
    """torch.load on CPU. Returns the loaded object (pickles may hold metadata
    objects that weights_only=True rejects, hence weights_only=False where
    this PyTorch has the argument)."""
    try:
        try:
            return torch.load(path, map_location="cpu", weights_only=False)
        except TypeError:  # PyTorch without the weights_only argument
            return torch.load(path, map_location="cpu")
    except OSError as e:
        raise ConvertError("%s: %s" % (path, e.strerror or e))
    except Exception as e:  # torch.load raises many kinds on a corrupt file
        why = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise ConvertError("%s: not a PyTorch checkpoint (%s)" % (path, why))


def unwrap(obj, path, wrappers):
    """Returns the flat {name: tensor} inside obj: the first of `wrappers`
    present (e.g. DeiT's "model", mmseg's "state_dict"), else obj itself.
    A DistributedDataParallel "module." prefix on every key is stripped."""
    if not isinstance(obj, dict):
        raise ConvertError("%s: not a state dict (a %s)" % (path, type(obj).__name__))
    for w in wrappers:
        if w in obj and isinstance(obj[w], dict):
            obj = obj[w]
            break
    sd = {}
    for k, v in obj.items():
        if not isinstance(v, torch.Tensor):
            raise ConvertError("%s: unexpected key '%s' (not a tensor; expected a state dict%s)"
                               % (path, k, " under " + "/".join(repr(w) for w in wrappers)
                                  if wrappers else ""))
        sd[k] = v
    if sd and all(k.startswith("module.") for k in sd):
        sd = {k[len("module."):]: v for k, v in sd.items()}
    if not sd:
        raise ConvertError("%s: empty state dict" % path)
    return sd


def default_heads(C):
    """DeiT/ViT head counts by width (Tiny 192/3, Small 384/6, Base 768/12,
    Large 1024/16): head dim 64."""
    if C % 64 == 0:
        return C // 64
    raise ConvertError("cannot guess the head count for width %d: pass --num-heads" % C)


def square_grid(n, path, key):
    g = int(round(math.sqrt(n)))
    if g * g != n:
        raise ConvertError("%s: %s has %d grid positions, not a square: pass --pos-grid HxW"
                           % (path, key, n))
    return [g, g]


def parse_pair(text, what):
    m = re.fullmatch(r"\s*(\d+)\s*[xX,]\s*(\d+)\s*", text)
    if not m:
        raise ConvertError("%s must look like 7x7, got '%s'" % (what, text))
    return [int(m.group(1)), int(m.group(2))]


def _shape(t):
    return list(t.shape)


def _expect(path, sd, key, shape):
    """Checks sd[key] exists with shape (None = any size on that axis)."""
    if key not in sd:
        raise ConvertError("%s: missing key '%s'" % (path, key))
    got = _shape(sd[key])
    if len(got) != len(shape) or any(s is not None and s != g for s, g in zip(shape, got)):
        raise ConvertError("%s: key '%s' has shape %s, expected %s"
                           % (path, key, got, ["*" if s is None else s for s in shape]))
    return sd[key]


def _pos_embed_grid(path, key, pos, n_prefix, pos_grid):
    """Drops the n_prefix token slots (class, distillation) from pos (1, n_prefix+N, C)."""
    if pos.dim() != 3 or pos.shape[0] != 1 or pos.shape[1] <= n_prefix:
        raise ConvertError("%s: key '%s' has shape %s, expected (1, %d+N, C)"
                           % (path, key, _shape(pos), n_prefix))
    n = pos.shape[1] - n_prefix
    grid = list(pos_grid) if pos_grid else square_grid(n, path, key)
    if grid[0] * grid[1] != n:
        raise ConvertError("%s: key '%s' has %d grid positions, --pos-grid %dx%d has %d"
                           % (path, key, n, grid[0], grid[1], grid[0] * grid[1]))
    return pos[:, n_prefix:, :].clone(), grid


# ---------------------------------------------------------------- timm / DeiT

# timm ViT names inside a block -> ours (identical, prefixed with backbone.)
_TIMM_BLOCK = re.compile(r"blocks\.(\d+)\.(norm1|attn\.qkv|attn\.proj|norm2|mlp\.fc1|mlp\.fc2)"
                         r"\.(weight|bias)$")
# dropped: classifier heads of ViT / DeiT (distilled) checkpoints
_TIMM_DROP = re.compile(r"(head|head_dist|pre_logits\.fc)\.(weight|bias)$")


def convert_timm(sd, path, num_heads=None, pos_grid=None):
    """timm/DeiT/MiTA-DeiT ViT state dict -> (our backbone.* state dict, backbone config)."""
    out = {}
    n_prefix = sum(1 for k in ("cls_token", "dist_token") if k in sd)
    for k, v in sd.items():
        if k in ("cls_token", "dist_token") or _TIMM_DROP.match(k):
            continue
        if k == "pos_embed":
            out["backbone.pos_embed"], grid = _pos_embed_grid(path, k, v, n_prefix, pos_grid)
        elif k in ("patch_embed.proj.weight", "patch_embed.proj.bias", "norm.weight", "norm.bias") \
                or _TIMM_BLOCK.match(k):
            out["backbone." + k] = v.clone()
        else:
            raise ConvertError("%s: unexpected key '%s' for a timm/DeiT ViT checkpoint" % (path, k))
    pw = _expect(path, sd, "patch_embed.proj.weight", [None, 3, None, None])
    C, p = pw.shape[0], pw.shape[2]
    if pw.shape[3] != p:
        raise ConvertError("%s: key 'patch_embed.proj.weight' is not square: %s" % (path, _shape(pw)))
    _expect(path, sd, "pos_embed", [1, None, C])
    cfg = _backbone_config(out, path, "backbone.blocks.%d.", C, p, num_heads,
                           [int(x) for x in grid], "backbone.norm.weight" in out)
    _check_backbone(out, cfg, path)
    return out, cfg


def _backbone_config(sd, path, block_fmt, C, p, num_heads, grid, final_norm):
    depth = 0
    while (block_fmt % depth) + "norm1.weight" in sd:
        depth += 1
    if depth == 0:
        raise ConvertError("%s: no transformer blocks found" % path)
    fc1 = _expect(path, sd, (block_fmt % 0) + "mlp.fc1.weight", [None, C])
    hidden = fc1.shape[0]
    if hidden % C:
        raise ConvertError("%s: MLP width %d is not a multiple of %d" % (path, hidden, C))
    heads = num_heads or default_heads(C)
    if C % heads:
        raise ConvertError("%s: width %d is not divisible by %d heads" % (path, C, heads))
    return {"patch_size": p, "embed_dim": C, "depth": depth, "num_heads": heads,
            "stem": {"type": "patch"}, "mlp_ratio": hidden // C, "ln_eps": 1e-6,
            "pos_grid": grid, "final_norm": bool(final_norm)}


def _check_backbone(sd, bb, path):
    """Every tensor of a backbone with config bb is present with its shape."""
    full = R.complete_config({"backbone": dict(bb, out_indices=[bb["depth"] - 1]), "classes": ["x"]})
    want = {k: v for k, v in R.model_tensors(R.Backbone(full["backbone"])).items()}
    for k, v in want.items():
        _expect(path, sd, "backbone." + k, _shape(v))
    extra = sorted(set(sd) - {"backbone." + k for k in want})
    if extra:
        raise ConvertError("%s: unexpected key '%s'" % (path, extra[0]))


def init_backbone(model, path):
    """Loads a `convert.py timm` file into model.backbone (for train.py --init-backbone).

    Renaming only, plus what a different training set-up needs: the position
    embedding is resized (bicubic, as at run time) from the file's grid to the
    model's pos_grid; the patch stem is skipped for a conv-stem model; the final
    norm is skipped when the model has none. Raises ConvertError when a shared
    tensor has another shape (e.g. a different width). Returns (loaded, skipped)
    lists of names."""
    ck = load_checkpoint(path)
    if not isinstance(ck, dict) or "state_dict" not in ck or "backbone_config" not in ck:
        raise ConvertError("%s: not a convert.py timm file (no state_dict/backbone_config)" % path)
    src, bb = ck["state_dict"], ck["backbone_config"]
    own = model.backbone.state_dict()
    new, loaded, skipped = {}, [], []
    for k, v in src.items():
        name = k[len("backbone."):]
        if name == "pos_embed":
            v = R.resize_pos_embed(v.float(), bb["pos_grid"], model.backbone.cfg["pos_grid"])
        if name not in own:
            skipped.append(k)
            continue
        if tuple(own[name].shape) != tuple(v.shape):
            raise ConvertError("%s: tensor %s has shape %s, the model wants %s"
                               % (path, k, _shape(v), _shape(own[name])))
        new[name] = v.to(own[name].dtype)
        loaded.append(k)
    model.backbone.load_state_dict(new, strict=False)
    return loaded, skipped


# ---------------------------------------------------------------- mmseg

_MM_BLOCK = re.compile(r"backbone\.layers\.(\d+)\.(.+)$")
_MM_BLOCK_MAP = {
    "ln1.weight": "norm1.weight", "ln1.bias": "norm1.bias",
    "attn.attn.in_proj_weight": "attn.qkv.weight", "attn.attn.in_proj_bias": "attn.qkv.bias",
    "attn.attn.out_proj.weight": "attn.proj.weight", "attn.attn.out_proj.bias": "attn.proj.bias",
    "ln2.weight": "norm2.weight", "ln2.bias": "norm2.bias",
    "ffn.layers.0.0.weight": "mlp.fc1.weight", "ffn.layers.0.0.bias": "mlp.fc1.bias",
    "ffn.layers.1.weight": "mlp.fc2.weight", "ffn.layers.1.bias": "mlp.fc2.bias",
}
_MM_TOP_MAP = {
    "backbone.patch_embed.projection.weight": "backbone.patch_embed.proj.weight",
    "backbone.patch_embed.projection.bias": "backbone.patch_embed.proj.bias",
    "backbone.ln1.weight": "backbone.norm.weight",
    "backbone.ln1.bias": "backbone.norm.bias",
}
_MM_NECK = re.compile(r"neck\.(lateral_convs|convs)\.(\d+)\.conv\.(weight|bias)$")


def default_out_indices(depth):
    """Four evenly spaced taps ending at the last block: 12 -> [2, 5, 8, 11]."""
    if depth < 4:
        raise ConvertError("depth %d has fewer than 4 blocks to tap: pass --out-indices" % depth)
    return [(j + 1) * depth // 4 - 1 for j in range(4)]


def default_palette(n):
    return [[(37 * i) % 256, (91 * i) % 256, (173 * i) % 256] for i in range(n)]


def _meta_classes(obj):
    """CLASSES/PALETTE an mmseg checkpoint may carry in its meta (0.x: meta.CLASSES,
    meta.PALETTE; 1.x: meta.dataset_meta.classes/palette)."""
    meta = obj.get("meta") if isinstance(obj, dict) else None
    if not isinstance(meta, dict):
        return None, None
    dm = meta.get("dataset_meta") if isinstance(meta.get("dataset_meta"), dict) else {}
    classes = meta.get("CLASSES") or dm.get("classes")
    palette = meta.get("PALETTE") or dm.get("palette")
    classes = [str(c) for c in classes] if classes is not None else None
    palette = [[int(x) for x in c] for c in palette] if palette is not None else None
    return classes, palette


def convert_mmseg(sd, path, opts, meta_classes=None, meta_palette=None):
    """mmseg UperNet(ViT) state dict -> (config, our full state dict)."""
    out = {}
    n_prefix = sum(1 for k in ("backbone.cls_token", "backbone.dist_token") if k in sd)
    grid = None
    for k, v in sd.items():
        if k.endswith("num_batches_tracked") or k.startswith("auxiliary_head."):
            continue
        if k in ("backbone.cls_token", "backbone.dist_token"):
            continue
        if k == "backbone.pos_embed":
            out["backbone.pos_embed"], grid = _pos_embed_grid(path, k, v, n_prefix, opts.get("pos_grid"))
            continue
        if k in _MM_TOP_MAP:
            out[_MM_TOP_MAP[k]] = v.clone()
            continue
        m = _MM_BLOCK.match(k)
        if m and m.group(2) in _MM_BLOCK_MAP:
            out["backbone.blocks.%s.%s" % (m.group(1), _MM_BLOCK_MAP[m.group(2)])] = v.clone()
            continue
        if _MM_NECK.match(k) or k.startswith("decode_head."):
            out[k] = v.clone()   # already our names; checked against the model below
            continue
        raise ConvertError("%s: unexpected key '%s' for an mmseg UperNet ViT checkpoint" % (path, k))
    if grid is None:
        raise ConvertError("%s: missing key 'backbone.pos_embed'" % path)

    pw = _expect(path, sd, "backbone.patch_embed.projection.weight", [None, 3, None, None])
    C, p = pw.shape[0], pw.shape[2]
    bb = _backbone_config(out, path, "backbone.blocks.%d.", C, p, opts.get("num_heads"),
                          grid, "backbone.norm.weight" in out)
    bb["ln_eps"] = opts.get("ln_eps", 1e-6)
    bb["out_indices"] = opts.get("out_indices") or default_out_indices(bb["depth"])
    if max(bb["out_indices"]) >= bb["depth"] or sorted(set(bb["out_indices"])) != bb["out_indices"] \
            or len(bb["out_indices"]) != 4:
        raise ConvertError("%s: out_indices %s: need 4 increasing blocks below depth %d"
                           % (path, bb["out_indices"], bb["depth"]))
    if bb["final_norm"] and bb["out_indices"][-1] != bb["depth"] - 1:
        # mmseg applies ln1 after the LAST block; we apply it to the last tap.
        raise ConvertError("%s: final norm backbone.ln1 needs the last tap on the last block (%d)"
                           % (path, bb["depth"] - 1))
    bb["attention"] = {"type": opts.get("attention", "mita"),
                       "landmarks": list(opts.get("landmarks", [7, 7])),
                       "topk": int(opts.get("topk", 49)),
                       "shared_scale": opts.get("shared_scale", "d")}

    if any(k.startswith("neck.") for k in out):
        lat = _expect(path, out, "neck.lateral_convs.0.conv.weight", [None, C, 1, 1])
        neck = {"type": "mln", "out_channels": int(lat.shape[0])}
    else:
        neck = {"type": "none"}

    bott = _expect(path, out, "decode_head.bottleneck.conv.weight", [None, None, 3, 3])
    ch = int(bott.shape[0])
    n_psp = 0
    while "decode_head.psp_modules.%d.1.conv.weight" % n_psp in out:
        n_psp += 1
    if opts.get("pool_scales"):
        scales = list(opts["pool_scales"])
        if len(scales) != n_psp:
            raise ConvertError("%s: %d psp modules but --pool-scales has %d"
                               % (path, n_psp, len(scales)))
    elif n_psp == 4:
        scales = [1, 2, 3, 6]   # every mmseg UperNet config
    else:
        raise ConvertError("%s: %d psp modules: pass --pool-scales" % (path, n_psp))
    seg = _expect(path, out, "decode_head.conv_seg.weight", [None, ch, 1, 1])
    K = int(seg.shape[0])
    classes = opts.get("classes") or meta_classes or ["class%d" % i for i in range(K)]
    if len(classes) != K:
        raise ConvertError("%s: the head has %d classes but %d names were given"
                           % (path, K, len(classes)))
    palette = opts.get("palette") or meta_palette or default_palette(K)
    if len(palette) != K or any(len(c) != 3 for c in palette):
        raise ConvertError("%s: the palette needs %d RGB triples, got %d" % (path, K, len(palette)))

    cfg = {
        "backbone": bb,
        "neck": neck,
        "decoder": {"type": "uperhead", "channels": ch, "pool_scales": scales,
                    "bn_eps": opts.get("bn_eps", 1e-5)},
        "classes": list(classes), "palette": palette,
        "ignore_index": opts.get("ignore_index"),
        "input": {"mean": list(R.IMAGENET_MEAN), "std": list(R.IMAGENET_STD),
                  "short_side": opts.get("short_side"), "pad_multiple": p},
        "provenance": "converted from %s (mmsegmentation UperNet ViT) by tools/convert.py"
                      % os.path.basename(path),
    }
    cfg = R.complete_config(cfg)

    # Every tensor the model needs, with its shape; nothing left over.
    want = R.model_tensors(R.MitaSeg(cfg))
    for k, v in want.items():
        _expect(path, out, k, _shape(v))
    extra = [k for k in out if k not in want]
    if extra:
        raise ConvertError("%s: unexpected key '%s' (not part of the inferred model)" % (path, extra[0]))
    return cfg, out


def build_model(cfg, sd):
    model = R.MitaSeg(cfg)
    want = R.model_tensors(model)
    model.load_state_dict({k: sd[k].to(want[k].dtype) for k in want}, strict=False)
    model.eval()
    return model


# ---------------------------------------------------------------- CLI

def _read_classes(path):
    with open(path) as f:
        names = [ln.strip() for ln in f if ln.strip()]
    if not names:
        raise ConvertError("%s: no class names" % path)
    return names


def _read_palette(path):
    """A JSON list of [r, g, b], or one `r g b` line per class."""
    with open(path) as f:
        text = f.read()
    try:
        pal = json.loads(text)
    except ValueError:
        pal = [[int(x) for x in ln.replace(",", " ").split()] for ln in text.splitlines() if ln.strip()]
    if not all(isinstance(c, list) and len(c) == 3 and all(0 <= int(x) <= 255 for x in c) for c in pal):
        raise ConvertError("%s: palette entries must be 3 integers 0..255" % path)
    return [[int(x) for x in c] for c in pal]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="kind", required=True)
    t = sub.add_parser("timm", help="ViT/DeiT backbone -> .pt state dict (backbone.*) + config")
    t.add_argument("input")
    t.add_argument("output")
    t.add_argument("--num-heads", type=int, default=None, help="default: width/64 (3, 6, 12)")
    t.add_argument("--pos-grid", default=None, help="HxW of the position embedding (default: square)")
    m = sub.add_parser("mmseg", help="mmseg UperNet ViT -> model file (.safetensors)")
    m.add_argument("input")
    m.add_argument("output")
    m.add_argument("--num-heads", type=int, default=None, help="default: width/64 (3, 6, 12)")
    m.add_argument("--pos-grid", default=None, help="HxW of the position embedding (default: square)")
    m.add_argument("--attention", choices=["mita", "full"], default="mita")
    m.add_argument("--landmarks", default="7x7")
    m.add_argument("--topk", type=int, default=49)
    m.add_argument("--shared-scale", choices=["d", "sqrt_d"], default="d")
    m.add_argument("--out-indices", default=None, help="e.g. 2,5,8,11 (default: 4 evenly spaced)")
    m.add_argument("--pool-scales", default=None, help="e.g. 1,2,3,6 (default when 4 psp modules)")
    m.add_argument("--ln-eps", type=float, default=1e-6, help="mmseg ViT configs use 1e-6")
    m.add_argument("--classes", default=None, help="file: one class name a line")
    m.add_argument("--palette", default=None, help="file: JSON [[r,g,b],...] or `r g b` lines")
    m.add_argument("--ignore-index", type=int, default=None)
    m.add_argument("--short-side", type=int, default=None, help="working size (default: native)")
    m.add_argument("--dtype", choices=["F32", "F16", "BF16"], default="F32")
    args = ap.parse_args(argv)

    try:
        if not os.path.isfile(args.input):
            raise ConvertError("%s: no such file" % args.input)
        obj = load_checkpoint(args.input)
        pos_grid = parse_pair(args.pos_grid, "--pos-grid") if args.pos_grid else None
        if args.kind == "timm":
            sd = unwrap(obj, args.input, ["model", "state_dict", "module"])
            out, bb = convert_timm(sd, args.input, args.num_heads, pos_grid)
            torch.save({"state_dict": out, "backbone_config": bb,
                        "source": os.path.basename(args.input)}, args.output)
            print("%s: %d tensors, backbone %s" % (args.output, len(out), json.dumps(bb)))
            return 0
        sd = unwrap(obj, args.input, ["state_dict", "model"])
        meta_classes, meta_palette = _meta_classes(obj)
        opts = {
            "num_heads": args.num_heads, "pos_grid": pos_grid, "attention": args.attention,
            "landmarks": parse_pair(args.landmarks, "--landmarks"), "topk": args.topk,
            "shared_scale": args.shared_scale, "ln_eps": args.ln_eps,
            "out_indices": [int(x) for x in args.out_indices.split(",")] if args.out_indices else None,
            "pool_scales": [int(x) for x in args.pool_scales.split(",")] if args.pool_scales else None,
            "classes": _read_classes(args.classes) if args.classes else None,
            "palette": _read_palette(args.palette) if args.palette else None,
            "ignore_index": args.ignore_index, "short_side": args.short_side,
        }
        cfg, out = convert_mmseg(sd, args.input, opts, meta_classes, meta_palette)
        R.save_model(build_model(cfg, out), args.output, dtype=args.dtype)
        print("%s: %d tensors, %d classes, backbone %d wide x %d deep, neck %s"
              % (args.output, len(out), len(cfg["classes"]), cfg["backbone"]["embed_dim"],
                 cfg["backbone"]["depth"], cfg["neck"]["type"]))
        return 0
    except (ConvertError, OSError) as e:
        print("convert.py: %s" % e, file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
