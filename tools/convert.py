#!/usr/bin/python3
"""Import public checkpoints into mitaseg naming, by renaming only.

  convert.py timm  IN.pth OUT.pt   [--num-heads H] [--pos-grid HxW]
      timm / DeiT / MiTA-DeiT ViT backbone -> a .pt file
      {"state_dict": {backbone.* tensors}, "backbone_config": {...}, "source": IN}
      to initialise training (see init_backbone(), for tools/train.py).
      The class token is kept (backbone.cls_token, mita-spec 1); a DeiT
      distillation token and its position slot are dropped (with a note: it
      only feeds DeiT's distillation head); the classifier heads are dropped.

  convert.py mmseg IN.pth OUT.safetensors [flags]
      mmsegmentation (0.x or 1.x) UperNet with a ViT/DeiT backbone
      (MultiLevelNeck or no neck) -> a complete model file
      (docs/model-format.md) that mitaseg runs as `mmseg test` would.
      Config inferred from tensor shapes and, where the checkpoint carries
      its training config (meta.cfg / meta.config), from that: num_heads,
      with_cls_token, the test-time resize and sliding window. What neither
      tells comes from flags (--num-heads, --cls-token, --attention,
      --landmarks, --topk, --shared-scale, --classes, --palette, --short-side,
      --out-indices, --ln-eps, --dtype).

mmseg specifics carried over: with_cls_token (mmseg's default True: the class
token goes through every block); patch_bias=False (mmseg 1.x's default: no
projection bias, converted as a zero bias); mmseg's test-time padding (the ViT
pads to whole patches and the padded logits are resized straight to the image,
input.padded_logits = "resize"); its sliding-window test (input.slide, crop
and stride) and working size (input.short_side, and input.long_side: mmcv's
keep-ratio Resize scale (long, short)); its resize of the uint8 image with
OpenCV before normalising (input.resize = "cv2_uint8"). The MultiLevelNeck must use
scales [4, 2, 1, 0.5] (mmseg's UperNet-ViT configs), the ViT no pre_norm, no
patch_norm, no LayerScale; anything else stops with an error.

Checkpoints are Python pickles (torch.load): convert only files you trust.
Errors are one line naming the file and the file's own key that does not fit;
notes (what was assumed) go to stderr prefixed "convert.py: note:".
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


NOTES = []


def note(msg):
    """What the converter assumed, for the user to check: printed to stderr
    after a successful conversion (a failed one prints only its error)."""
    NOTES.append(msg)


# Published ViT/DeiT head counts by width (head dim 64).
PUBLISHED_HEADS = {192: (3, "ViT-Ti"), 384: (6, "ViT-S"), 768: (12, "ViT-B"), 1024: (16, "ViT-L")}
# Model names in checkpoint metadata (DeiT's args.model, timm's arch) -> heads.
_NAME_HEADS = [("tiny", 3), ("small", 6), ("base", 12), ("large", 16), ("huge", 16)]


def default_heads(C):
    """DeiT/ViT head counts by width (Tiny 192/3, Small 384/6, Base 768/12,
    Large 1024/16): head dim 64."""
    if C % 64 == 0:
        return C // 64
    raise ConvertError("cannot guess the head count for width %d: pass --num-heads" % C)


def resolve_heads(path, C, given, known, where):
    """The head count: `known` (from the checkpoint's own config/metadata,
    found at `where`) wins and a different --num-heads is an error; without
    it the count cannot be checked from the weights (any divisor of the width
    fits them), so say so and name the published value for the width."""
    if known is not None:
        if given is not None and given != known:
            raise ConvertError("%s: --num-heads %d, but the checkpoint's %s says %d heads: "
                               "drop --num-heads (or fix it)" % (path, given, where, known))
        return known
    pub = PUBLISHED_HEADS.get(C)
    heads = given or default_heads(C)
    if pub and heads != pub[0]:
        note("%s: %d heads cannot be checked against the weights; the published %s "
             "(width %d) has %d" % (path, heads, pub[1], C, pub[0]))
    elif given is None:
        note("%s: no head count in the checkpoint; using %d (width %d / 64%s): pass "
             "--num-heads if it was trained with another" % (path, heads, C,
                                                              ", as %s" % pub[1] if pub else ""))
    return heads


def heads_from_name(name):
    name = str(name).lower()
    for word, h in _NAME_HEADS:
        if word in name:
            return h
    return None


def _cfg_text(obj):
    """The training config an mmseg checkpoint carries (1.x meta.cfg, 0.x
    meta.config), or ""."""
    meta = obj.get("meta") if isinstance(obj, dict) else None
    if not isinstance(meta, dict):
        return ""
    for k in ("cfg", "config"):
        if isinstance(meta.get(k), str):
            return meta[k]
    return ""


def _dict_bodies(text, key=None):
    """The texts inside every `key=dict(...)` (every `dict(...)` for key None;
    balanced parentheses)."""
    out = []
    pat = r"\bdict\(" if key is None else r"\b%s\s*=\s*dict\(" % re.escape(key)
    for m in re.finditer(pat, text):
        depth, i = 1, m.end()
        while i < len(text) and depth:
            depth += {"(": 1, ")": -1}.get(text[i], 0)
            i += 1
        out.append(text[m.end():i - 1])
    return out


def _pair(text, key):
    """key=(a, b) (any spacing, a trailing comma allowed) or key=a -> [a, b]."""
    m = re.search(r"\b%s\s*=\s*(?:\(\s*(\d+)\s*,\s*(\d+)\s*,?\s*\)|(\d+))" % key, text)
    if not m:
        return None
    return [int(m.group(1)), int(m.group(2))] if m.group(1) else [int(m.group(3))] * 2


def mmseg_cfg_facts(text):
    """What the converter needs from an mmseg config text (its pretty_text,
    0.x or 1.x): the backbone's num_heads, with_cls_token and img_size (the
    position grid), test_cfg's slide crop and stride, the test pipeline's
    Resize scale and a size_divisor."""
    f = {}
    bbs = _dict_bodies(text, "backbone")
    bbt = bbs[0] if bbs else ""
    m = re.search(r"\bnum_heads\s*=\s*(\d+)", bbt)
    if m:
        f["num_heads"] = int(m.group(1))
    m = re.search(r"\bwith_cls_token\s*=\s*(True|False)", bbt)
    if m:
        f["with_cls_token"] = m.group(1) == "True"
    if _pair(bbt, "img_size"):
        f["img_size"] = _pair(bbt, "img_size")
    for tc in _dict_bodies(text, "test_cfg"):
        if re.search(r"\bmode\s*=\s*'slide'", tc) and _pair(tc, "crop_size") and _pair(tc, "stride"):
            f["slide"] = {"crop": _pair(tc, "crop_size"), "stride": _pair(tc, "stride")}
        # the data preprocessor's test_cfg pads before the model (1.x)
        m = re.search(r"\bsize_divisor\s*=\s*(\d+)", tc)
        if m:
            f["size_divisor"] = int(m.group(1))
    m = re.search(r"\btest_pipeline\s*=\s*\[", text)
    if m:
        for d in _dict_bodies(text[m.end():])[:8]:
            if re.search(r"type\s*=\s*'Resize'", d) and re.search(r"keep_ratio\s*=\s*True", d):
                sc = _pair(d, "scale") or _pair(d, "img_scale")
                if sc:
                    f["resize_scale"] = sc
                break
    return f


# Keys that say what a checkpoint is, for the "wrong subcommand / not a plain
# ViT" answers (checked before anything else).
_SWIN = re.compile(r"(relative_position_bias_table|relative_position_index|\.w_msa\.|attn_mask$)")
_CONVNEXT = re.compile(r"(dwconv|depthwise_conv|conv_dw|downsample_layers)")


def diagnose(sd, path, kind):
    """Raises a ConvertError that says what to do when the checkpoint is not
    what `kind` converts: the other subcommand's kind, or not a plain ViT."""
    for k in sd:
        if _SWIN.search(k):
            raise ConvertError("%s: a Swin Transformer checkpoint (key '%s'): not a plain ViT; "
                               "convert.py supports plain ViT/DeiT backbones only" % (path, k))
    for k in sd:
        if _CONVNEXT.search(k):
            raise ConvertError("%s: a ConvNeXt checkpoint (key '%s'): not a plain ViT; "
                               "convert.py supports plain ViT/DeiT backbones only" % (path, k))
    mm = [k for k in sd if k.startswith(("backbone.layers.", "decode_head.",
                                         "backbone.patch_embed.projection."))]
    tm = [k for k in sd if k.startswith(("blocks.", "patch_embed.proj."))]
    if kind == "timm" and mm:
        raise ConvertError("%s: an mmsegmentation checkpoint (key '%s'): use `convert.py mmseg` "
                           "(it converts the whole segmenter)" % (path, mm[0]))
    if kind == "mmseg" and tm and not mm:
        raise ConvertError("%s: a timm/DeiT backbone checkpoint (key '%s'): use `convert.py timm` "
                           "(a backbone for tools/train.py --init-backbone); it has no "
                           "segmentation head to run" % (path, tm[0]))


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


def _expect(path, sd, key, shape, name=None):
    """Checks sd[key] exists with shape (None = any size on that axis).
    name(key): the key as the checkpoint spells it, for the message."""
    shown = name(key) if name else key
    if key not in sd:
        raise ConvertError("%s: missing key '%s'" % (path, shown))
    got = _shape(sd[key])
    if len(got) != len(shape) or any(s is not None and s != g for s, g in zip(shape, got)):
        raise ConvertError("%s: key '%s' has shape %s, expected %s"
                           % (path, shown, got, ["*" if s is None else s for s in shape]))
    return sd[key]


def _pos_embed_grid(path, key, pos, n_prefix, pos_grid, keep_cls=False):
    """Drops the n_prefix token slots (class, distillation) from pos
    (1, n_prefix+N, C); keep_cls keeps the first (the class token's) in
    front. When the grid alone is a square and the prefix slots are not
    there (timm's no_embed_class, e.g. DeiT III) the class slot is zero:
    those models add no position to the class token."""
    if pos.dim() != 3 or pos.shape[0] != 1 or pos.shape[1] <= n_prefix:
        raise ConvertError("%s: key '%s' has shape %s, expected (1, %d+N, C)"
                           % (path, key, _shape(pos), n_prefix))
    n = pos.shape[1] - n_prefix
    if n_prefix and not pos_grid and not _is_square(n) and _is_square(pos.shape[1]):
        n, pos = pos.shape[1], torch.cat([pos.new_zeros(1, n_prefix, pos.shape[2]), pos], 1)
    grid = list(pos_grid) if pos_grid else square_grid(n, path, key)
    if grid[0] * grid[1] != n:
        raise ConvertError("%s: key '%s' has %d grid positions, --pos-grid %dx%d has %d"
                           % (path, key, n, grid[0], grid[1], grid[0] * grid[1]))
    body = pos[:, n_prefix:, :]
    if keep_cls:
        body = torch.cat([pos[:, :1, :], body], 1)
    return body.clone(), grid


def _is_square(n):
    return int(round(math.sqrt(n))) ** 2 == n


# ---------------------------------------------------------------- timm / DeiT

# timm ViT names inside a block -> ours (identical, prefixed with backbone.)
_TIMM_BLOCK = re.compile(r"blocks\.(\d+)\.(norm1|attn\.qkv|attn\.proj|norm2|mlp\.fc1|mlp\.fc2)"
                         r"\.(weight|bias)$")
# dropped: classifier heads of ViT / DeiT (distilled) checkpoints
_TIMM_DROP = re.compile(r"(head|head_dist|pre_logits\.fc)\.(weight|bias)$")


def _timm_name(k):
    return k[len("backbone."):] if k.startswith("backbone.") else k


def convert_timm(sd, path, num_heads=None, pos_grid=None, known_heads=None, heads_where=""):
    """timm/DeiT/MiTA-DeiT ViT state dict -> (our backbone.* state dict, backbone config)."""
    diagnose(sd, path, "timm")
    out = {}
    cls = "cls_token" in sd
    n_prefix = sum(1 for k in ("cls_token", "dist_token") if k in sd)
    grid = None
    for k, v in sd.items():
        if k == "dist_token" or _TIMM_DROP.match(k):
            continue
        if k == "cls_token":
            out["backbone.cls_token"] = v.clone()
        elif k == "pos_embed":
            out["backbone.pos_embed"], grid = _pos_embed_grid(path, k, v, n_prefix, pos_grid,
                                                              keep_cls=cls)
        elif k in ("patch_embed.proj.weight", "patch_embed.proj.bias", "norm.weight", "norm.bias") \
                or _TIMM_BLOCK.match(k):
            out["backbone." + k] = v.clone()
        else:
            raise ConvertError("%s: unexpected key '%s' for a timm/DeiT ViT checkpoint" % (path, k))
    if "dist_token" in sd:
        note("%s: DeiT distillation token dropped (with its position slot): it only feeds "
             "the distillation head" % path)
    pw = _expect(path, sd, "patch_embed.proj.weight", [None, 3, None, None])
    C, p = pw.shape[0], pw.shape[2]
    if pw.shape[3] != p:
        raise ConvertError("%s: key 'patch_embed.proj.weight' is not square: %s" % (path, _shape(pw)))
    _expect(path, sd, "pos_embed", [1, None, C])
    heads = resolve_heads(path, C, num_heads, known_heads, heads_where)
    cfg = _backbone_config(out, path, "backbone.blocks.%d.", C, p, heads,
                           [int(x) for x in grid], "backbone.norm.weight" in out, _timm_name)
    if cls:
        cfg["cls_token"] = True
    _check_backbone(out, cfg, path, _timm_name)
    return out, cfg


def _backbone_config(sd, path, block_fmt, C, p, heads, grid, final_norm, name):
    depth = 0
    while (block_fmt % depth) + "norm1.weight" in sd:
        depth += 1
    if depth == 0:
        raise ConvertError("%s: no transformer blocks found" % path)
    fc1 = _expect(path, sd, (block_fmt % 0) + "mlp.fc1.weight", [None, C], name)
    hidden = fc1.shape[0]
    if hidden % C:
        raise ConvertError("%s: MLP width %d is not a multiple of %d" % (path, hidden, C))
    if C % heads:
        raise ConvertError("%s: width %d is not divisible by %d heads" % (path, C, heads))
    return {"patch_size": p, "embed_dim": C, "depth": depth, "num_heads": heads,
            "stem": {"type": "patch"}, "mlp_ratio": hidden // C, "ln_eps": 1e-6,
            "pos_grid": grid, "final_norm": bool(final_norm)}


def _check_backbone(sd, bb, path, name):
    """Every tensor of a backbone with config bb is present with its shape."""
    full = R.complete_config({"backbone": dict(bb, out_indices=[bb["depth"] - 1]), "classes": ["x"]})
    want = {k: v for k, v in R.model_tensors(R.Backbone(full["backbone"])).items()}
    for k, v in want.items():
        _expect(path, sd, "backbone." + k, _shape(v), name)
    extra = sorted(set(sd) - {"backbone." + k for k in want})
    if extra:
        raise ConvertError("%s: unexpected key '%s'" % (path, name(extra[0])))


def init_backbone(model, path):
    """Loads a `convert.py timm` file into model.backbone (for train.py --init-backbone).

    Renaming only, plus what a different training set-up needs: the position
    embedding is resized from the file's grid to the model's pos_grid the way
    the checkpoint's framework would (timm: bicubic with antialias=True, which
    differs from the engine's plain bicubic even when upsampling); the patch
    stem is skipped for a conv-stem model; the final norm is skipped when the
    model has none. Raises ConvertError when a shared
    tensor has another shape (e.g. a different width). A class token loads into
    a model with one; for a model without one it is skipped (and its position
    slot dropped). Returns (loaded, skipped) lists of names."""
    ck = load_checkpoint(path)
    if not isinstance(ck, dict) or "state_dict" not in ck or "backbone_config" not in ck:
        raise ConvertError("%s: not a convert.py timm file (no state_dict/backbone_config)" % path)
    src, bb = ck["state_dict"], ck["backbone_config"]
    own = model.backbone.state_dict()
    new, loaded, skipped = {}, [], []
    src_cls, own_cls = 1 if bb.get("cls_token") else 0, model.backbone.ncls
    for k, v in src.items():
        name = k[len("backbone."):]
        if name == "pos_embed":
            # timm resamples with antialiased bicubic (tools/README.md); do as
            # the checkpoint's own framework would at this grid
            v = R.resize_pos_embed(v.float(), bb["pos_grid"], model.backbone.cfg["pos_grid"],
                                   ncls=src_cls, antialias=ck.get("framework", "timm") == "timm")
            if src_cls and not own_cls:
                v = v[:, 1:]   # the model has no class token: its slot goes with it
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


def _mm_file_key(k):
    """Our name -> the mmseg checkpoint's, for messages."""
    m = re.match(r"backbone\.blocks\.(\d+)\.(.+)$", k)
    if m:
        inv = {v: kk for kk, v in _MM_BLOCK_MAP.items()}
        return "backbone.layers.%s.%s" % (m.group(1), inv.get(m.group(2), m.group(2)))
    inv = {v: kk for kk, v in _MM_TOP_MAP.items()}
    return inv.get(k, k)


# ADE20K's mmseg test set-up for ViT-UperNet (mmseg 1.2.2's
# configs/_base_/datasets/ade20k.py: Resize(scale=(2048, 512), keep_ratio=True);
# _base_/models/upernet_vit-b16_ln_mln.py: test_cfg=dict(mode='whole')). Other
# ADE20K configs (SETR, ConvNeXt, Swin) slide 512 at stride 341: a checkpoint
# that carries such a config gets its window from there, or pass --slide.
ADE20K_TEST = {"short_side": 512, "long_side": 2048, "slide": None}


def convert_mmseg(sd, path, opts, meta_classes=None, meta_palette=None, cfg_text=""):
    """mmseg UperNet(ViT) state dict -> (config, our full state dict)."""
    diagnose(sd, path, "mmseg")
    facts = mmseg_cfg_facts(cfg_text) if cfg_text else {}
    where = "training config (meta)"
    has_cls = "backbone.cls_token" in sd
    cls = opts.get("cls_token")
    if cls is None:
        cls = facts.get("with_cls_token", True) and has_cls
        if has_cls and "with_cls_token" not in facts:
            note("%s: class token on (mmseg's default with_cls_token=True; the checkpoint "
                 "carries no config to say otherwise): pass --cls-token off for a model "
                 "trained with with_cls_token=False" % path)
    elif cls and not has_cls:
        raise ConvertError("%s: --cls-token on, but there is no key 'backbone.cls_token'" % path)
    out = {}
    n_prefix = sum(1 for k in ("backbone.cls_token", "backbone.dist_token") if k in sd)
    grid = None
    pos_grid = opts.get("pos_grid")
    pw0 = sd.get("backbone.patch_embed.projection.weight")
    if not pos_grid and "img_size" in facts and pw0 is not None and pw0.dim() == 4:
        # the position grid mmseg trained at: img_size / patch (its _pos_embeding)
        pos_grid = [facts["img_size"][0] // pw0.shape[2], facts["img_size"][1] // pw0.shape[3]]
    for k, v in sd.items():
        if k.endswith("num_batches_tracked") or k.startswith("auxiliary_head."):
            continue
        if k == "backbone.cls_token":
            if cls:
                out["backbone.cls_token"] = v.clone()
            continue
        if k == "backbone.dist_token":
            continue
        if k == "backbone.pos_embed":
            out["backbone.pos_embed"], grid = _pos_embed_grid(path, k, v, n_prefix, pos_grid,
                                                              keep_cls=cls)
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
    if "backbone.patch_embed.proj.bias" not in out:
        # mmseg 1.x's VisionTransformer defaults to patch_bias=False
        out["backbone.patch_embed.proj.bias"] = torch.zeros(C, dtype=pw.dtype)
        note("%s: no 'backbone.patch_embed.projection.bias' (mmseg 1.x patch_bias=False): "
             "a zero bias" % path)
    heads = resolve_heads(path, C, opts.get("num_heads"), facts.get("num_heads"), where)
    bb = _backbone_config(out, path, "backbone.blocks.%d.", C, p, heads,
                          grid, "backbone.norm.weight" in out, _mm_file_key)
    if cls:
        bb["cls_token"] = True
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

    # Test-time geometry as mmseg runs it: flags, else the training config,
    # else ADE20K's set-up for an ADE20K head (150 classes, meta names).
    short_side, slide = opts.get("short_side"), opts.get("slide")
    long_side = opts.get("long_side")
    ade = K == 150 and (meta_classes or [""])[0] == "wall"
    if short_side is None and "resize_scale" in facts:
        # mmcv keep_ratio with scale (long, short): both sides bound the size
        short_side, long_side = min(facts["resize_scale"]), long_side or max(facts["resize_scale"])
    if slide is None and "slide" in facts:
        slide = facts["slide"]
    if ade and short_side is None and slide is None and not facts:
        short_side, slide = ADE20K_TEST["short_side"], ADE20K_TEST["slide"]
        long_side = long_side or ADE20K_TEST["long_side"]
        note("%s: an ADE20K head: mmseg's ADE20K ViT-UperNet test set-up (short side 512, "
             "whole image) written as the model's default" % path)
    if slide == "none":
        slide = None
    padded_logits, pad_multiple = opts.get("padded_logits"), p
    if facts.get("size_divisor"):
        # padded before the model, the padding cropped from the logits after
        pad_multiple = facts["size_divisor"] * p // math.gcd(facts["size_divisor"], p)
        padded_logits = padded_logits or "crop"
    # else mmseg pads inside the ViT and resizes the padded logits straight
    # to the unpadded size (no crop)
    padded_logits = padded_logits or "resize"

    cfg = {
        "backbone": bb,
        "neck": neck,
        "decoder": {"type": "uperhead", "channels": ch, "pool_scales": scales,
                    "bn_eps": opts.get("bn_eps", 1e-5)},
        "classes": list(classes), "palette": palette,
        "ignore_index": opts.get("ignore_index"),
        "input": {"mean": list(R.IMAGENET_MEAN), "std": list(R.IMAGENET_STD),
                  "short_side": short_side, "pad_multiple": pad_multiple,
                  "padded_logits": padded_logits,
                  # mmcv.imresize: OpenCV on the uint8 image, before normalising
                  "resize": opts.get("resize") or "cv2_uint8"},
        "provenance": "converted from %s (mmsegmentation UperNet ViT) by tools/convert.py"
                      % os.path.basename(path),
    }
    if slide:
        cfg["input"]["slide"] = slide
    if short_side and long_side:
        cfg["input"]["long_side"] = long_side
    cfg = R.complete_config(cfg)

    # Every tensor the model needs, with its shape; nothing left over.
    want = R.model_tensors(R.MitaSeg(cfg))
    for k, v in want.items():
        _expect(path, out, k, _shape(v), _mm_file_key)
    extra = [k for k in out if k not in want]
    if extra:
        raise ConvertError("%s: unexpected key '%s' (not part of the inferred model)"
                           % (path, _mm_file_key(extra[0])))
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


def _timm_meta_heads(obj):
    """(heads, where) from a timm/DeiT training checkpoint's model name
    (DeiT: args.model; timm's train.py: arch / args.model), else (None, "")."""
    if not isinstance(obj, dict):
        return None, ""
    args = obj.get("args")
    name = getattr(args, "model", None) or (args.get("model") if isinstance(args, dict) else None)
    for what, val in (("args.model", name), ("arch", obj.get("arch"))):
        h = heads_from_name(val) if val else None
        if h:
            return h, "%s '%s'" % (what, val)
    return None, ""


def _parse_slide(text):
    """CROP,STRIDE or CHxCW,SHxSW -> {"crop": [h, w], "stride": [h, w]}; "none"; None."""
    if text is None or text == "none":
        return text
    parts = text.split(",")
    if len(parts) != 2:
        raise ConvertError("--slide must look like 512,341 or none, got '%s'" % text)
    pair = lambda t: parse_pair(t, "--slide") if "x" in t.lower() else [int(t), int(t)]
    try:
        crop, stride = pair(parts[0]), pair(parts[1])
    except ValueError:
        raise ConvertError("--slide must look like 512,341 or none, got '%s'" % text)
    if min(crop + stride) < 1 or any(s > c for s, c in zip(stride, crop)):
        raise ConvertError("--slide %s: need 1 <= stride <= crop" % text)
    return {"crop": crop, "stride": stride}


def _print_notes():
    for n in NOTES:
        print("convert.py: note: %s" % n, file=sys.stderr)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="kind", required=True)
    t = sub.add_parser("timm", help="ViT/DeiT backbone -> .pt state dict (backbone.*) + config")
    t.add_argument("input")
    t.add_argument("output")
    t.add_argument("--num-heads", type=int, default=None,
                   help="default: from the checkpoint's metadata, else width/64 (3, 6, 12, 16)")
    t.add_argument("--pos-grid", default=None, help="HxW of the position embedding (default: square)")
    m = sub.add_parser("mmseg", help="mmseg UperNet ViT -> model file (.safetensors)")
    m.add_argument("input")
    m.add_argument("output")
    m.add_argument("--num-heads", type=int, default=None,
                   help="default: from the checkpoint's config, else width/64 (3, 6, 12, 16)")
    m.add_argument("--pos-grid", default=None, help="HxW of the position embedding (default: square)")
    m.add_argument("--cls-token", choices=["on", "off"], default=None,
                   help="mmseg with_cls_token (default: the checkpoint's config, else on)")
    m.add_argument("--padded-logits", choices=["resize", "crop"], default=None,
                   help="resize: as mmseg pads inside the ViT (padded logits resized to the "
                        "image; the default); crop: crop the padding first (mmseg with a "
                        "test-time size_divisor, the default then; mitaseg's own models)")
    m.add_argument("--slide", default=None,
                   help="sliding-window test: CROP,STRIDE (e.g. 512,341) or none "
                        "(default: the checkpoint's config, else none)")
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
    m.add_argument("--long-side", type=int, default=None,
                   help="cap on the working size's long side, mmcv keep_ratio's scale (long, "
                        "short) (default: the config's Resize scale, else none)")
    m.add_argument("--resize", choices=["cv2_uint8", "float"], default="cv2_uint8",
                   help="cv2_uint8: resize the uint8 image exactly as mmseg does (OpenCV "
                        "INTER_LINEAR), the default; float: mitaseg's bilinear on the float image")
    m.add_argument("--dtype", choices=["F32", "F16", "BF16"], default="F32")
    args = ap.parse_args(argv)

    del NOTES[:]
    try:
        if not os.path.isfile(args.input):
            raise ConvertError("%s: no such file" % args.input)
        obj = load_checkpoint(args.input)
        pos_grid = parse_pair(args.pos_grid, "--pos-grid") if args.pos_grid else None
        if args.kind == "timm":
            sd = unwrap(obj, args.input, ["model", "state_dict", "module"])
            known, where = _timm_meta_heads(obj)
            out, bb = convert_timm(sd, args.input, args.num_heads, pos_grid, known, where)
            torch.save({"state_dict": out, "backbone_config": bb,
                        "source": os.path.basename(args.input)}, args.output)
            print("%s: %d tensors, backbone %s" % (args.output, len(out), json.dumps(bb)))
            _print_notes()
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
            "long_side": args.long_side, "resize": args.resize,
            "cls_token": None if args.cls_token is None else args.cls_token == "on",
            "padded_logits": args.padded_logits, "slide": _parse_slide(args.slide),
        }
        cfg, out = convert_mmseg(sd, args.input, opts, meta_classes, meta_palette, _cfg_text(obj))
        R.save_model(build_model(cfg, out), args.output, dtype=args.dtype)
        print("%s: %d tensors, %d classes, backbone %d wide x %d deep, neck %s"
              % (args.output, len(out), len(cfg["classes"]), cfg["backbone"]["embed_dim"],
                 cfg["backbone"]["depth"], cfg["neck"]["type"]))
        _print_notes()
        return 0
    except (ConvertError, OSError) as e:
        print("convert.py: %s" % e, file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
