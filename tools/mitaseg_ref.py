"""mitaseg reference model: an independent PyTorch rendering of
docs/mita-spec.md (math) and docs/model-format.md (file + tensor names).

It is meant to be read next to the spec: each piece cites the spec section it
implements. It is used to train (tools/train.py), to export model files
(tools/export.py) and to generate the golden test fixtures
(tools/gen_fixtures.py). It is differentiable end to end (MiTA included).

Layout of this file
  1. config (model-format.md `config`)            complete_config()
  2. MiTA / full attention (spec section 2)       attention_full(), attention_mita()
  3. backbone (spec section 1)                    Backbone
  4. necks + UPerHead (spec section 3)            MLNNeck, FPNDeconvNeck, UPerHead
  5. whole model                                  MitaSeg
  6. pre/post-processing (spec sections 3.6, 4)   preprocess(), postprocess(), segment()
  7. model file I/O (model-format.md)             save_model(), load_model()

Stage names recorded by MitaSeg.forward(x, stages=dict) (batch dim first):
  T = N tokens, or 1 + N with a class token (it comes first in the sequence);
  pos_embed (1,T,C) resized; embed (B,T,C); blocks.{i} (B,T,C);
  taps.{j} (B,C,Hp,Wp); neck.{l} (B,Cn,h_l,w_l); head.psp (B,ch,h3,w3);
  head.fpn.{l} (B,ch,h_l,w_l) l=0..2; head.fused (B,ch,h0,w0);
  head.logits (B,classes,h0,w0);
  per MiTA layer i: layers.{i}.topk_idx (B,h,M,k) int64, layers.{i}.route
  (B,h,T) int64, layers.{i}.probe (B,h,M,T) = L K^T, layers.{i}.routing
  (B,h,T,M) = Q L^T (both unscaled), plus layers.{i}.grid = (Gh, Gw, k)
  (the effective landmarks and top-k). Recorded positions are numbered as
  mita-spec 2.7 reports them: grid tokens 0..N-1, the class token N (last).
segment() adds: image, input, logits (B,classes,H,W), mask (B,H,W).
Config keys this file reads beyond complete_config's: backbone.cls_token,
input.padded_logits ("crop" | "resize"), input.slide ({crop, stride}),
input.resize ("float" | "cv2_uint8"), input.long_side (int or null).
"""

import copy
import json
import math

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

import safetensors_io

IMAGENET_MEAN = [123.675, 116.28, 103.53]
IMAGENET_STD = [58.395, 57.12, 57.375]

# tools/export_onnx.py sets this while it traces the model: the two ops the
# ONNX exporter of torch 1.13 rejects get exportable equivalents (MiTA's
# stable sort becomes torch.topk, which keeps either of two exactly tied keys;
# adaptive average pooling to a size that does not divide the input becomes
# window sums by 0/1 matrices, equal up to the last bit). Off: the goldens use
# the exact ops (and training, but for TRAIN_TOPK below).
EXPORT_ONNX = False

# tools/train.py and pretrain.py set this: MiTA's routed sets by torch.topk too where
# gradients are on (a stable sort of each probe row took 8 ms a layer in a
# CPU training step, topk 2 ms; which of two exactly tied keys is kept does
# not matter to training). Validation (no_grad) and the goldens keep the
# exact order.
TRAIN_TOPK = False

# --------------------------------------------------------------------------
# 1. Config
# --------------------------------------------------------------------------

DEFAULT_ATTENTION = {"type": "mita", "landmarks": [7, 7], "topk": 49, "shared_scale": "d"}


def complete_config(cfg):
    """Returns a deep copy of cfg with every optional key filled with its default."""
    cfg = copy.deepcopy(cfg)
    bb = cfg["backbone"]
    bb.setdefault("patch_size", 16)
    bb.setdefault("stem", {"type": "patch"})
    bb.setdefault("mlp_ratio", 4)
    bb.setdefault("ln_eps", 1e-6)
    bb.setdefault("out_indices", [2, 5, 8, 11])
    bb.setdefault("final_norm", False)
    # cls_token (default false) is not filled in: files without one keep
    # their config strings byte for byte; read it with bb.get("cls_token").
    att = bb.setdefault("attention", {})
    for k, v in DEFAULT_ATTENTION.items():
        att.setdefault(k, copy.deepcopy(v))
    for k in ("embed_dim", "depth", "num_heads", "pos_grid"):
        if k not in bb:
            raise KeyError("config: missing backbone.%s" % k)
    cfg.setdefault("neck", {"type": "none"})
    dec = cfg.setdefault("decoder", {})
    dec.setdefault("type", "uperhead")
    dec.setdefault("channels", 128)
    dec.setdefault("pool_scales", [1, 2, 3, 6])
    dec.setdefault("bn_eps", 1e-5)
    if "classes" not in cfg:
        raise KeyError("config: missing classes")
    cfg.setdefault("palette", [[(37 * i) % 256, (91 * i) % 256, (173 * i) % 256]
                               for i in range(len(cfg["classes"]))])
    cfg.setdefault("ignore_index", None)
    inp = cfg.setdefault("input", {})
    inp.setdefault("mean", list(IMAGENET_MEAN))
    inp.setdefault("std", list(IMAGENET_STD))
    inp.setdefault("short_side", None)
    inp.setdefault("pad_multiple", bb["patch_size"])
    cfg.setdefault("provenance", "")
    return cfg


def neck_channels(cfg):
    """Cin of the decoder: the mln neck's out_channels, else the backbone width."""
    if cfg["neck"]["type"] == "mln":
        return cfg["neck"]["out_channels"]
    return cfg["backbone"]["embed_dim"]


def stem_skips(cfg):
    """The conv stem outputs (by index) that the mln neck's first
    neck.stem_skips (0, 1 or 2) levels take: each level the one of its size.
    Level l is 4 / 2^l times the token grid, stem output i 2^(n-1-i) times
    it (n stem convs), so level l takes output n - 3 + l."""
    ns = cfg["neck"].get("stem_skips", 0)
    if not ns:
        return []
    bb = cfg["backbone"]
    if cfg["neck"]["type"] != "mln" or bb["stem"]["type"] != "conv":
        raise ValueError("neck.stem_skips needs the mln neck and a conv stem")
    n = len(bb["stem"]["channels"])
    if not isinstance(ns, int) or not 0 <= ns <= 2 or n - 3 < 0:
        raise ValueError("neck.stem_skips: 0, 1 or 2, with at least 3 stem convs")
    return [n - 3 + l for l in range(ns)]


def resolve_attention(cfg_att, override):
    """Training config attention, with any run-time override applied."""
    att = dict(cfg_att)
    if override:
        att.update({k: v for k, v in override.items() if v is not None})
    return att


# --------------------------------------------------------------------------
# 2. Attention (spec section 2). q, k, v: (B, h, N, d).
# --------------------------------------------------------------------------

def first_argmax(x, dim=-1):
    """argmax that returns the FIRST index of the maximum (spec: ties to lower)."""
    n = x.shape[dim]
    mx = x.max(dim=dim, keepdim=True).values
    shape = [1] * x.dim()
    shape[dim] = n
    pos = torch.arange(n, device=x.device).view(shape).expand_as(x)
    big = torch.full_like(pos, n)
    return torch.where(x == mx, pos, big).min(dim=dim).values


def pool_windows(n_in, n_out, dtype):
    """(n_out, n_in) 0/1 matrix: row i marks the window [floor(i*S/G),
    ceil((i+1)*S/G)); and (n_out,) the window lengths. Built in numpy: a traced
    constant, not tensor writes in the graph."""
    A, n = np.zeros((n_out, n_in)), np.zeros(n_out)
    for i in range(n_out):
        a, b = (i * n_in) // n_out, -((-(i + 1) * n_in) // n_out)
        A[i, a:b], n[i] = 1.0, b - a
    return torch.from_numpy(A).to(dtype), torch.from_numpy(n).to(dtype)


def adaptive_avg_pool(x, size):
    """F.adaptive_avg_pool2d(x (B, C, H, W), size); when EXPORT_ONNX, window
    sums as constant 0/1 matrices A_h x A_w^T divided by the window areas
    (identical windows; the sums' order may differ in the last bit)."""
    if not EXPORT_ONNX:
        return F.adaptive_avg_pool2d(x, size)
    H, W = x.shape[-2:]
    Ah, nh = pool_windows(H, size[0], x.dtype)
    Aw, nw = pool_windows(W, size[1], x.dtype)
    return (Ah @ x @ Aw.t()) / (nh[:, None] * nw[None, :])


class AdaptiveAvgPool(nn.Module):
    """nn.AdaptiveAvgPool2d through adaptive_avg_pool() (no parameters)."""

    def __init__(self, size):
        super().__init__()
        self.size = (size, size)

    def forward(self, x):
        return adaptive_avg_pool(x, self.size)


def attention_full(q, k, v):
    """softmax(Q K^T s) V per head."""
    s = q.shape[-1] ** -0.5
    return torch.softmax(q @ k.transpose(-1, -2) * s, dim=-1) @ v


def mita_landmarks(q_tokens, grid, landmarks, num_heads):
    """Spec 2.1: landmarks L from q before the head split.

    q_tokens (B, N, C); grid (Hp, Wp); landmarks (Gh, Gw) clamped to the grid.
    Returns L (B, h, M, d) and the effective (Gh, Gw).
    adaptive average pooling uses exactly the spec's windows
    [floor(i*S/G), ceil((i+1)*S/G)).
    """
    B, N, C = q_tokens.shape
    Hp, Wp = grid
    gh, gw = min(landmarks[0], Hp), min(landmarks[1], Wp)
    qmap = q_tokens.transpose(1, 2).reshape(B, C, Hp, Wp)
    lmap = adaptive_avg_pool(qmap, (gh, gw))                   # (B, C, gh, gw)
    L = lmap.reshape(B, C, gh * gw).transpose(1, 2)            # (B, M, C)
    d = C // num_heads
    L = L.reshape(B, gh * gw, num_heads, d).transpose(1, 2)    # (B, h, M, d)
    return L, (gh, gw)


def report_order(t, ncls, dim):
    """Sequence order (class token first) -> the order records report (spec 2.7:
    grid tokens 0..N-1, then the class token)."""
    return torch.cat([t.narrow(dim, ncls, t.shape[dim] - ncls), t.narrow(dim, 0, ncls)], dim)


def attention_mita(q, k, v, L, topk, shared_scale, record=None, ncls=0):
    """Spec 2.2-2.5 (and 2.7) for all heads at once.

    q, k, v (B, h, N, d), the first ncls tokens the class token (a key and
    query like any other; ties go to the lower sequence index, so it wins
    them); L (B, h, M, d) landmarks of the grid tokens. topk clamped to N.
    shared_scale "d": shared logit q.l * s * s (= q.l/d); "sqrt_d": q.l * s.
    record: optional dict, filled with probe/routing/topk_idx/route.

    Implementation note: the routed logits q_n . k_idx and the routed output
    sum_j p_j v_idx are computed by gathering from Q K^T and scattering the
    probabilities into a (N, N) matrix. This is the same math as gathering
    each query's k keys/values (tools/gen_fixtures.py checks it against a
    naive per-query loop) and is cheaper in memory at training sizes.
    """
    B, h, N, d = q.shape
    M = L.shape[2]
    kk = min(topk, N)
    s = d ** -0.5
    s_sh = s if shared_scale == "d" else 1.0
    if shared_scale not in ("d", "sqrt_d"):
        raise ValueError("shared_scale must be 'd' or 'sqrt_d'")

    # 2.2 probe and each expert's routed set: the k largest P[m, :], ties to the
    # lower position (stable descending sort keeps equal values in index order).
    P = L @ k.transpose(-1, -2)                                  # (B, h, M, N)
    if EXPORT_ONNX or (TRAIN_TOPK and torch.is_grad_enabled()):
        idx = torch.topk(P.detach(), kk, dim=-1).indices
    else:
        idx = torch.sort(P.detach(), dim=-1, descending=True, stable=True).indices[..., :kk]

    # 2.3 shared expert: each landmark's softmax summary of all values.
    Sv = torch.softmax(P * s, dim=-1) @ v                         # (B, h, M, d)

    # 2.4 routing, top-1, ties to the lower expert.
    R = q @ L.transpose(-1, -2)                                   # (B, h, N, M)
    e = first_argmax(R.detach(), dim=-1)                          # (B, h, N)

    # 2.5 joint softmax over M shared + k routed logits.
    idx_n = torch.gather(idx, 2, e.unsqueeze(-1).expand(B, h, N, kk))  # (B, h, N, k)
    QK = q @ k.transpose(-1, -2)                                  # (B, h, N, N)
    b = torch.gather(QK, -1, idx_n) * s                           # (B, h, N, k)
    a = R * (s * s_sh)                                            # (B, h, N, M)
    p = torch.softmax(torch.cat([a, b], dim=-1), dim=-1)
    p_sh, p_rt = p[..., :M], p[..., M:]
    # (p_rt's dtype: under CUDA autocast softmax is float32 next to bf16 QK)
    dense = torch.zeros_like(QK, dtype=p_rt.dtype).scatter(-1, idx_n, p_rt)  # idx_n unique per row
    out = p_sh @ Sv + dense @ v

    if record is not None:
        # positions and queries renumbered: class token last (spec 2.7)
        order = (lambda t, dim: report_order(t, ncls, dim)) if ncls else (lambda t, dim: t)
        record["probe"] = order(P, -1)
        record["routing"] = order(R, -2)
        record["topk_idx"] = (idx - ncls) % N if ncls else idx
        record["route"] = order(e, -1)
    return out


# --------------------------------------------------------------------------
# 3. Backbone (spec section 1)
# --------------------------------------------------------------------------

class ConvModule(nn.Module):
    """mmseg ConvModule: conv (no bias) -> BatchNorm -> ReLU. Names .conv / .bn."""

    def __init__(self, cin, cout, ksize, stride=1, padding=0, bn_eps=1e-5):
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, ksize, stride, padding, bias=False)
        self.bn = nn.BatchNorm2d(cout, eps=bn_eps)

    def forward(self, x):
        return F.relu(self.bn(self.conv(x)))


class Attention(nn.Module):
    def __init__(self, dim, num_heads):
        super().__init__()
        self.num_heads = num_heads
        self.qkv = nn.Linear(dim, 3 * dim, bias=True)   # rows: q, k, v; heads contiguous
        self.proj = nn.Linear(dim, dim)

    def forward(self, x, grid, att, record=None, ncls=0):
        B, N, C = x.shape
        h = self.num_heads
        d = C // h
        qkv = self.qkv(x)                                             # (B, N, 3C)
        q_tok, k_tok, v_tok = qkv.split(C, dim=-1)                    # each (B, N, C)
        heads = lambda t: t.reshape(B, N, h, d).transpose(1, 2)       # (B, h, N, d)
        q, k, v = heads(q_tok), heads(k_tok), heads(v_tok)
        if att["type"] == "full":
            o = attention_full(q, k, v)
        elif att["type"] == "mita":
            # spec 2.7: the landmarks pool the grid tokens only
            L, (gh, gw) = mita_landmarks(q_tok[:, ncls:] if ncls else q_tok, grid,
                                         att["landmarks"], h)
            o = attention_mita(q, k, v, L, att["topk"], att["shared_scale"], record, ncls)
            if record is not None:
                record["grid"] = (gh, gw, min(att["topk"], N))
        else:
            raise ValueError("attention type must be 'mita' or 'full'")
        o = o.transpose(1, 2).reshape(B, N, C)                        # concat heads
        return self.proj(o)


class Mlp(nn.Module):
    def __init__(self, dim, hidden):
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(x)))   # exact (erf) GELU


class Block(nn.Module):
    """Pre-norm ViT block: x += proj(attn(LN1 x)); x += fc2(GELU(fc1(LN2 x)))."""

    # stochastic depth rate (train.py's drop_path knob): in training mode each
    # sample's branch is dropped with this probability, kept ones scaled by
    # 1 / (1 - rate); inference (eval mode) is the plain block
    drop_path = 0.0

    def __init__(self, dim, num_heads, mlp_ratio, ln_eps):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, eps=ln_eps)
        self.attn = Attention(dim, num_heads)
        self.norm2 = nn.LayerNorm(dim, eps=ln_eps)
        self.mlp = Mlp(dim, int(dim * mlp_ratio))

    def _branch(self, y):
        """y (B, T, C): the residual branch, stochastic depth applied."""
        if not self.training or self.drop_path <= 0.0:
            return y
        keep = 1.0 - self.drop_path
        mask = y.new_empty((y.shape[0], 1, 1)).bernoulli_(keep)
        return y * (mask / keep)

    def forward(self, x, grid, att, record=None, ncls=0):
        x = x + self._branch(self.attn(self.norm1(x), grid, att, record, ncls))
        return x + self._branch(self.mlp(self.norm2(x)))


class PatchEmbed(nn.Module):
    def __init__(self, patch, dim):
        super().__init__()
        self.proj = nn.Conv2d(3, dim, patch, stride=patch)

    def forward(self, x):
        return self.proj(x)


class ConvStem(nn.Module):
    """log2(patch) x (3x3 s2 p1 conv, BN eps 1e-5, ReLU), then 1x1 conv + bias.

    Children are named "0", "1", ... and "proj": backbone.stem.{i}.conv/.bn,
    backbone.stem.proj.
    """

    def __init__(self, patch, channels, dim):
        super().__init__()
        n = int(round(math.log2(patch)))
        if 2 ** n != patch or len(channels) != n:
            raise ValueError("conv stem needs log2(patch)=%d channel entries" % n)
        cin = 3
        for i, c in enumerate(channels):
            self.add_module(str(i), ConvModule(cin, c, 3, 2, 1, bn_eps=1e-5))
            cin = c
        self.n = n
        self.proj = nn.Conv2d(cin, dim, 1, bias=True)

    def forward(self, x, skips=None):
        """skips: a list that receives each 3x3 conv's output (1/2, 1/4, ...)."""
        for i in range(self.n):
            x = getattr(self, str(i))(x)
            if skips is not None:
                skips.append(x)
        return self.proj(x)


def resize_pos_embed(pos, src_grid, dst_grid, ncls=0, antialias=False):
    """(1, ncls + Hs*Ws, C) -> (1, ncls + Hd*Wd, C), bicubic, align_corners=False.

    The first ncls rows (the class token's) are kept as they are (spec 1).
    antialias=True is timm's resampling (tools/README.md), for --init-backbone."""
    if tuple(src_grid) == tuple(dst_grid):
        return pos
    C = pos.shape[-1]
    m = pos[:, ncls:].reshape(1, src_grid[0], src_grid[1], C).permute(0, 3, 1, 2)
    kw = {"antialias": True} if antialias else {}
    m = F.interpolate(m, size=tuple(dst_grid), mode="bicubic", align_corners=False, **kw)
    m = m.permute(0, 2, 3, 1).reshape(1, dst_grid[0] * dst_grid[1], C)
    return torch.cat([pos[:, :ncls], m], 1) if ncls else m   # no empty slices (ONNX export)


class Backbone(nn.Module):
    def __init__(self, bb):
        super().__init__()
        C = bb["embed_dim"]
        self.cfg = bb
        if bb["stem"]["type"] == "patch":
            self.patch_embed = PatchEmbed(bb["patch_size"], C)
        elif bb["stem"]["type"] == "conv":
            self.stem = ConvStem(bb["patch_size"], bb["stem"]["channels"], C)
        else:
            raise ValueError("backbone.stem.type must be 'patch' or 'conv'")
        gh, gw = bb["pos_grid"]
        self.ncls = 1 if bb.get("cls_token") else 0
        if self.ncls:
            self.cls_token = nn.Parameter(torch.zeros(1, 1, C))
        self.pos_embed = nn.Parameter(torch.zeros(1, self.ncls + gh * gw, C))
        self.blocks = nn.ModuleList(
            [Block(C, bb["num_heads"], bb["mlp_ratio"], bb["ln_eps"]) for _ in range(bb["depth"])])
        if bb["final_norm"]:
            self.norm = nn.LayerNorm(C, eps=bb["ln_eps"])

    def forward(self, x, att, stages=None, skips=None, embed_fn=None):
        """x (B, 3, H, W) normalised, padded. Returns the 4 taps (B, C, Hp, Wp).
        skips: a list that receives the conv stem's outputs (conv stem only).
        embed_fn: applied to the patch tokens (B, N, C) before the position
        embedding (tools/pretrain.py: masked tokens replaced)."""
        bb = self.cfg
        x = self.patch_embed(x) if bb["stem"]["type"] == "patch" else self.stem(x, skips)
        B, C, Hp, Wp = x.shape
        nc = self.ncls
        pos = resize_pos_embed(self.pos_embed, bb["pos_grid"], (Hp, Wp), nc)
        x = x.flatten(2).transpose(1, 2)                             # (B, N, C)
        if embed_fn is not None:
            x = embed_fn(x)
        if nc:
            x = torch.cat([self.cls_token.expand(B, -1, -1), x], 1)  # (B, 1 + N, C)
        x = x + pos
        if stages is not None:
            stages["pos_embed"] = pos
            stages["embed"] = x
        taps = []
        out_idx = list(bb["out_indices"])
        for i, blk in enumerate(self.blocks):
            rec = {} if (stages is not None and att["type"] == "mita") else None
            x = blk(x, (Hp, Wp), att, rec, nc)
            if stages is not None:
                stages["blocks.%d" % i] = x
                if rec is not None:
                    for k, v in rec.items():
                        stages["layers.%d.%s" % (i, k)] = v
            if i in out_idx:
                t = x
                if bb["final_norm"] and len(taps) == len(out_idx) - 1:
                    t = self.norm(t)   # final LayerNorm on the last tap only
                t = t[:, nc:] if nc else t                                  # taps drop it
                taps.append(t.transpose(1, 2).reshape(B, C, Hp, Wp))
            if len(taps) == len(out_idx):
                break   # blocks past the last tap do not affect the output
        if stages is not None:
            for j, t in enumerate(taps):
                stages["taps.%d" % j] = t
        return taps


# --------------------------------------------------------------------------
# 4. Neck and UPerHead (spec section 3)
# --------------------------------------------------------------------------

def bilinear(x, **size_or_scale):
    """F.interpolate(x, mode="bilinear", align_corners=False). A bf16 tensor
    on the CPU (autocast training) is resized in fp32, channels-last, and
    cast back: torch 1.13's bf16 CPU kernel took 34 ms forward and backward
    at (8, 128, 60, 80), fp32 channels-last 2 ms."""
    if x.dtype == torch.bfloat16 and x.device.type == "cpu":
        y = F.interpolate(x.float().contiguous(memory_format=torch.channels_last),
                          mode="bilinear", align_corners=False, **size_or_scale)
        return y.to(torch.bfloat16)
    return F.interpolate(x, mode="bilinear", align_corners=False, **size_or_scale)


def resize(x, size):
    """Bilinear resize to a size, align_corners=False, no antialias."""
    if tuple(x.shape[-2:]) == tuple(size):
        return x
    return bilinear(x, size=tuple(size))


class _ConvWithBias(nn.Module):
    """Holds .conv (with bias, no norm, no act): mmseg ConvModule(norm=None, act=None)."""

    def __init__(self, cin, cout, ksize, padding=0):
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, ksize, padding=padding, bias=True)

    def forward(self, x):
        return self.conv(x)


class MLNNeck(nn.Module):
    """MultiLevelNeck: 1x1 conv, resize by scale 4/2/1/0.5, 3x3 conv.

    stem_channels (neck.stem_skips, the engine's extension, conv stem only):
    level l also takes the conv stem output of its size (stem_skips(cfg)[l],
    of stem_channels[l] channels) through a 1x1 conv with bias, added before
    the 3x3 conv: the stem's high-resolution detail for thin classes that
    the 1/16 tokens lose."""
    SCALES = (4, 2, 1, 0.5)

    def __init__(self, cin, cout, stem_channels=()):
        super().__init__()
        self.lateral_convs = nn.ModuleList([_ConvWithBias(cin, cout, 1) for _ in range(4)])
        self.convs = nn.ModuleList([_ConvWithBias(cout, cout, 3, 1) for _ in range(4)])
        if stem_channels:
            self.stem_convs = nn.ModuleList([_ConvWithBias(c, cout, 1) for c in stem_channels])

    def forward(self, taps, skips=()):
        outs = []
        for l, t in enumerate(taps):
            x = self.lateral_convs[l](t)
            if self.SCALES[l] != 1:
                # scale_factor semantics: out = floor(S*scale), coords by 1/scale
                x = bilinear(x, scale_factor=self.SCALES[l])
            if l < len(skips):
                x = x + self.stem_convs[l](skips[l])
            outs.append(self.convs[l](x))
        return outs


class FPNDeconvNeck(nn.Module):
    """BEiT-style neck. Tensor names (the engine's choice, tools/README.md):
    neck.fpn1.0 ConvTranspose2d(C,C,2,2)+bias, neck.fpn1.1 BatchNorm2d,
    (fpn1.2 GELU), neck.fpn1.3 ConvTranspose2d+bias, neck.fpn2.0 ConvTranspose2d+bias;
    level 2 identity, level 3 MaxPool2d(2). BN eps = decoder.bn_eps."""

    def __init__(self, C, bn_eps):
        super().__init__()
        self.fpn1 = nn.Sequential(nn.ConvTranspose2d(C, C, 2, 2), nn.BatchNorm2d(C, eps=bn_eps),
                                  nn.GELU(), nn.ConvTranspose2d(C, C, 2, 2))
        self.fpn2 = nn.Sequential(nn.ConvTranspose2d(C, C, 2, 2))

    def forward(self, taps):
        return [self.fpn1(taps[0]), self.fpn2(taps[1]), taps[2], F.max_pool2d(taps[3], 2)]


class UPerHead(nn.Module):
    def __init__(self, cin, ch, pool_scales, n_classes, bn_eps, dropout=0.1):
        super().__init__()
        self.pool_scales = list(pool_scales)
        self.psp_modules = nn.ModuleList([
            nn.Sequential(AdaptiveAvgPool(s), ConvModule(cin, ch, 1, bn_eps=bn_eps))
            for s in self.pool_scales])
        self.bottleneck = ConvModule(cin + len(self.pool_scales) * ch, ch, 3, padding=1, bn_eps=bn_eps)
        self.lateral_convs = nn.ModuleList([ConvModule(cin, ch, 1, bn_eps=bn_eps) for _ in range(3)])
        self.fpn_convs = nn.ModuleList([ConvModule(ch, ch, 3, padding=1, bn_eps=bn_eps) for _ in range(3)])
        self.fpn_bottleneck = ConvModule(4 * ch, ch, 3, padding=1, bn_eps=bn_eps)
        self.dropout = nn.Dropout2d(dropout)
        self.conv_seg = nn.Conv2d(ch, n_classes, 1)

    def forward(self, feats, stages=None):
        x3 = feats[3]
        # 1. PPM on level 3, then the 3x3 bottleneck = lateral 3
        ppm = [x3] + [resize(m(x3), x3.shape[-2:]) for m in self.psp_modules]
        lat = [self.lateral_convs[l](feats[l]) for l in range(3)]     # 2. laterals 0..2
        lat.append(self.bottleneck(torch.cat(ppm, dim=1)))
        for i in range(3, 0, -1):                                     # 3. top-down
            lat[i - 1] = lat[i - 1] + resize(lat[i], lat[i - 1].shape[-2:])
        outs = [self.fpn_convs[l](lat[l]) for l in range(3)] + [lat[3]]   # 4.
        size0 = outs[0].shape[-2:]
        fused = self.fpn_bottleneck(torch.cat([outs[0]] + [resize(o, size0) for o in outs[1:]], 1))
        logits = self.conv_seg(self.dropout(fused))                  # 5.
        if stages is not None:
            stages["head.psp"] = lat[3]
            for l in range(3):
                stages["head.fpn.%d" % l] = outs[l]
            stages["head.fused"] = fused
            stages["head.logits"] = logits
        return logits


# --------------------------------------------------------------------------
# 5. Whole model
# --------------------------------------------------------------------------

class MitaSeg(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = complete_config(cfg)
        cfg = self.cfg
        self.backbone = Backbone(cfg["backbone"])
        C = cfg["backbone"]["embed_dim"]
        nt = cfg["neck"]["type"]
        if nt == "mln":
            self.neck = MLNNeck(C, cfg["neck"]["out_channels"],
                                [cfg["backbone"]["stem"]["channels"][i] for i in stem_skips(cfg)])
        elif nt == "fpn-deconv":
            self.neck = FPNDeconvNeck(C, cfg["decoder"]["bn_eps"])
        elif nt != "none":
            raise ValueError("neck.type must be mln, fpn-deconv or none")
        dec = cfg["decoder"]
        self.decode_head = UPerHead(neck_channels(cfg), dec["channels"], dec["pool_scales"],
                                    len(cfg["classes"]), dec["bn_eps"])

    def forward(self, x, attn=None, stages=None):
        """x (B, 3, ph, pw) normalised + padded -> logits (B, classes, h0, w0).

        attn: run-time override of the attention ({type, landmarks, topk,
        shared_scale}, any subset). stages: optional dict filled with every
        intermediate (see the module docstring)."""
        att = resolve_attention(self.cfg["backbone"]["attention"], attn)
        sk = stem_skips(self.cfg)
        stem_out = [] if sk else None
        taps = self.backbone(x, att, stages, stem_out)
        if self.cfg["neck"]["type"] == "none":
            feats = list(taps)
        elif sk:
            feats = self.neck(taps, [stem_out[i] for i in sk])
        else:
            feats = self.neck(taps)
        if stages is not None:
            for l, f in enumerate(feats):
                stages["neck.%d" % l] = f
        return self.decode_head(feats, stages)


# --------------------------------------------------------------------------
# 6. Pre- and post-processing (spec sections 3.6 and 4)
# --------------------------------------------------------------------------

def working_size(H, W, cfg):
    """(rh, rw): the size the image is resized to before padding: mmcv's
    keep-ratio rescale, s = min(short_side / min(H, W), long_side / max(H, W))
    (the long side's term only with input.long_side), each side int(x*s + 0.5),
    at least 1."""
    ss, ls = cfg["input"]["short_side"], cfg["input"].get("long_side")
    if not ss:
        return H, W
    scale = ss / min(H, W)
    if ls:
        scale = min(scale, ls / max(H, W))
    return max(1, int(math.floor(H * scale + 0.5))), max(1, int(math.floor(W * scale + 0.5)))


def resize_uint8_cv2(img, size):
    """uint8 (H, W, C) -> (h, w, C) as OpenCV's cv2.resize(img, (w, h),
    interpolation=INTER_LINEAR) computes it for 8-bit images (mmcv.imresize in
    mmseg's test pipeline), bit for bit: source coordinate (x + 0.5) * (1 /
    (w / W)) - 0.5 in double rounded to float, weights rint(f * 2048) (11
    bits), columns outside the image clamped with weight (1, 0), rows clamped
    when read; a horizontal pass in exact integers, then the vertical
    rounding of OpenCV's vectorised loop: ((b0 * (h0 >> 4)) >> 16) +
    ((b1 * (h1 >> 4)) >> 16), (+ 2) >> 2. An exact 2x reduction is OpenCV's
    2x2 mean, (a + b + c + d + 2) >> 2; an unchanged size a copy."""
    a = np.asarray(img)
    H, W = a.shape[:2]
    h, w = size
    if (h, w) == (H, W):
        return a.copy()
    sx_scale, sy_scale = 1.0 / (w / W), 1.0 / (h / H)
    if abs(sx_scale - 2) < np.finfo(np.float64).eps and abs(sy_scale - 2) < np.finfo(np.float64).eps:
        s = a.astype(np.int64)
        return ((s[0::2, 0::2] + s[0::2, 1::2] + s[1::2, 0::2] + s[1::2, 1::2] + 2) >> 2).astype(np.uint8)

    def coeffs(n, scale):
        f = ((np.arange(n) + 0.5) * scale - 0.5).astype(np.float32)
        i = np.floor(f).astype(np.int64)
        return i, (f - i.astype(np.float32)).astype(np.float32)

    def weights(f):
        one = np.float32(2048)
        return np.rint((np.float32(1) - f) * one).astype(np.int64), np.rint(f * one).astype(np.int64)

    sx, fx = coeffs(w, sx_scale)
    out = (sx < 0) | (sx >= W - 1)
    fx[out] = 0
    sx = np.clip(sx, 0, W - 1)
    a0, a1 = weights(fx)
    sy, fy = coeffs(h, sy_scale)
    b0, b1 = weights(fy)
    s = a.astype(np.int64)
    rows = s[:, sx] * a0[None, :, None] + s[:, np.minimum(sx + 1, W - 1)] * a1[None, :, None]
    h0, h1 = rows[np.clip(sy, 0, H - 1)], rows[np.clip(sy + 1, 0, H - 1)]
    v = (((b0[:, None, None] * (h0 >> 4)) >> 16) + ((b1[:, None, None] * (h1 >> 4)) >> 16) + 2) >> 2
    return np.clip(v, 0, 255).astype(np.uint8)


def normalise(img, cfg, dtype=torch.float32, mirror=False):
    """img uint8 (H, W, 3) RGB (numpy or tensor) -> ((1, 3, rh, rw), (rh, rw)):
    resized to the working size, then normalised. Not padded. input.resize
    "float" (default): bilinear, align_corners=False, no antialias, on the
    float image; "cv2_uint8": the uint8 image as OpenCV resizes it
    (resize_uint8_cv2), as mmseg's test pipeline does. mirror: the image
    mirrored left-right (before a float resize, after a cv2_uint8 one, as
    the engine and mmseg's flip TTA do)."""
    cfg = complete_config(cfg)
    H, W = np.asarray(img).shape[:2] if not torch.is_tensor(img) else img.shape[:2]
    rh, rw = working_size(H, W, cfg)
    if cfg["input"].get("resize", "float") == "cv2_uint8":
        a = resize_uint8_cv2(np.asarray(img), (rh, rw))
        t = torch.as_tensor(np.ascontiguousarray(a[:, ::-1] if mirror else a))
        t = t.to(dtype).permute(2, 0, 1).unsqueeze(0)
    else:
        if mirror:
            img = np.ascontiguousarray(np.asarray(img)[:, ::-1])
        t = img if torch.is_tensor(img) else torch.as_tensor(np.asarray(img))   # tensor: traceable
        t = t.to(dtype).permute(2, 0, 1).unsqueeze(0)                           # (1,3,H,W)
        t = resize(t, (rh, rw))
    mean = torch.tensor(cfg["input"]["mean"], dtype=dtype).view(1, 3, 1, 1)
    std = torch.tensor(cfg["input"]["std"], dtype=dtype).view(1, 3, 1, 1)
    return (t - mean) / std, (rh, rw)


def pad_input(t, cfg, size):
    """Zero-pads (B, 3, h, w), (h, w) = size as Python ints (so an ONNX trace
    pads by constants), right/bottom to a multiple of input.pad_multiple."""
    pm = complete_config(cfg)["input"]["pad_multiple"] or 1
    h, w = size
    return F.pad(t, (0, -(-w // pm) * pm - w, 0, -(-h // pm) * pm - h))


def preprocess(img, cfg, dtype=torch.float32, mirror=False):
    """img uint8 (H, W, 3) RGB (numpy or tensor) -> (input (1,3,ph,pw), (rh, rw)).

    Resize to the working size (normalise(): the float image bilinearly, or
    the uint8 image as OpenCV does with input.resize cv2_uint8); normalise;
    zero-pad right/bottom to a multiple of pad_multiple."""
    t, size = normalise(img, cfg, dtype, mirror)
    return pad_input(t, cfg, size), size


def unpad_logits(head_logits, padded_size, size, padded_logits="crop"):
    """Level-0 logits of a padded input -> logits at the unpadded size.
    "crop" (spec 3.6): resize to the padded input, crop the padding.
    "resize" (mmseg, input.padded_logits): resize straight to the unpadded
    size, the padding's share squeezed in (mmseg's decode_head.predict_by_feat
    resizes to img_shape)."""
    if padded_logits == "resize":
        return resize(head_logits, size)
    if padded_logits != "crop":
        raise ValueError("input.padded_logits must be 'crop' or 'resize'")
    return resize(head_logits, padded_size)[..., :size[0], :size[1]]


def postprocess(head_logits, padded_size, resized_size, image_size, padded_logits="crop"):
    """Level-0 logits -> (logits at image size (B,K,H,W), mask (B,H,W) uint8)."""
    x = unpad_logits(head_logits, padded_size, resized_size, padded_logits)
    x = resize(x, image_size)
    mask = first_argmax(x, dim=1).to(torch.uint8)
    return x, mask


def slide_logits(model, x, slide, attn=None):
    """mmseg's EncoderDecoder.slide_inference on the normalised, unpadded
    working-size image x (1, 3, H, W): windows crop at stride (the last flush
    with the end), each padded and run like a whole image, its logits brought
    to the window's size; summed, then divided by how many windows cover each
    pixel. -> (1, K, H, W)."""
    (hc, wc), (hs, ws) = slide["crop"], slide["stride"]
    _, _, H, W = x.shape
    hg = max(H - hc + hs - 1, 0) // hs + 1
    wg = max(W - wc + ws - 1, 0) // ws + 1
    K = len(model.cfg["classes"])
    preds = x.new_zeros((1, K, H, W))
    count = x.new_zeros((1, 1, H, W))
    for hi in range(hg):
        for wi in range(wg):
            y1, x1 = hi * hs, wi * ws
            y2, x2 = min(y1 + hc, H), min(x1 + wc, W)
            y1, x1 = max(y2 - hc, 0), max(x2 - wc, 0)
            crop = pad_input(x[:, :, y1:y2, x1:x2], model.cfg, (y2 - y1, x2 - x1))
            head = model(crop, attn=attn)
            win = unpad_logits(head, crop.shape[-2:], (y2 - y1, x2 - x1),
                               model.cfg["input"].get("padded_logits", "crop"))
            preds += F.pad(win, (x1, W - x2, y1, H - y2))
            count[:, :, y1:y2, x1:x2] += 1
    return preds / count


def segment(model, img, attn=None, stages=None, whole=False, tta=None):
    """Whole pipeline for one uint8 (H,W,3) image. Returns (mask (H,W), logits (K,H,W)).
    A model with input.slide runs sliding windows (unless whole=True; stages
    then holds only image, logits and mask).

    tta="flip": the logits are the mean of the image's and of its mirror
    image's (mirrored back); the mask is their argmax; `stages` holds the
    unflipped pass (its MiTA record) and the averaged logits and mask."""
    dtype = next(model.parameters()).dtype
    H, W = np.asarray(img).shape[:2]
    slide = model.cfg["input"].get("slide")

    def run(image, st, mirror=False):
        """(network input, logits (1,K,H,W)) of one image (mirrored: of its
        mirror image)."""
        if slide and not whole:
            x, _ = normalise(image, model.cfg, dtype, mirror)
            return x, resize(slide_logits(model, x, slide, attn), (H, W))
        x, rsize = preprocess(image, model.cfg, dtype, mirror)
        head = model(x, attn=attn, stages=st)
        logits, _ = postprocess(head, x.shape[-2:], rsize, (H, W),
                                model.cfg["input"].get("padded_logits", "crop"))
        return x, logits

    x, logits = run(img, stages)
    if tta == "flip":
        _, mirrored = run(img, None, mirror=True)
        logits = 0.5 * (logits + mirrored.flip(-1))
    elif tta is not None:
        raise ValueError("tta must be None or 'flip'")
    mask = first_argmax(logits, dim=1).to(torch.uint8)
    if stages is not None:
        stages["image"] = torch.as_tensor(np.asarray(img))
        if not slide or whole:
            stages["input"] = x
        stages["logits"] = logits
        stages["mask"] = mask
    return mask[0], logits[0]


# --------------------------------------------------------------------------
# 7. Model file (model-format.md)
# --------------------------------------------------------------------------

def model_tensors(model):
    """state_dict without BN's num_batches_tracked (BN stats stay unfused)."""
    return {k: v.detach().cpu() for k, v in model.state_dict().items()
            if not k.endswith("num_batches_tracked")}


def save_model(model, path, dtype="F32", provenance=None):
    """Writes the model file. dtype: "F32", "F16" or "BF16" for every weight."""
    cfg = copy.deepcopy(model.cfg)
    if provenance is not None:
        cfg["provenance"] = provenance
    tensors = {k: v.float() for k, v in model_tensors(model).items()}
    dtypes = {k: dtype for k in tensors}
    meta = {"format": "mitaseg", "format_version": "1",
            "config": json.dumps(cfg, separators=(",", ":"))}
    safetensors_io.save(path, tensors, meta, dtypes)


def load_model(path, dtype=torch.float32):
    """Reads a model file -> MitaSeg in eval mode (weights widened to dtype)."""
    tensors, meta = safetensors_io.load(path)
    if meta.get("format") != "mitaseg" or meta.get("format_version") != "1":
        raise ValueError("%s: not a mitaseg v1 model file" % path)
    model = MitaSeg(json.loads(meta["config"]))
    sd = {k: torch.from_numpy(np.asarray(v, dtype=np.float64)).to(dtype) for k, v in tensors.items()}
    want = model_tensors(model)
    missing = sorted(set(want) - set(sd))
    extra = sorted(set(sd) - set(want))
    if missing:
        raise ValueError("%s: missing tensors %s" % (path, missing[:5]))
    for k in want:
        if tuple(want[k].shape) != tuple(sd[k].shape):
            raise ValueError("%s: tensor %s has shape %s, expected %s"
                             % (path, k, list(sd[k].shape), list(want[k].shape)))
    model.to(dtype)
    model.load_state_dict({k: sd[k] for k in want}, strict=False)
    model.eval()
    model.extra_tensors = extra
    return model
