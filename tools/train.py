#!/usr/bin/python3
"""Train the mitaseg reference model (tools/mitaseg_ref.py) on CamVid-style lists.

  /usr/bin/python3 tools/train.py --config tools/configs/camvid-mita.json \
      --out /work/runs/camvid-mita --epochs 60 [--resume]
  /usr/bin/python3 tools/train.py --config tools/configs/camvid-mita-xseq.json \
      --out /work/runs/xseq --holdout 0006R0 --time-budget 600

The config file has two parts: "model" (the model-format.md config, stored in
the exported model file) and "train" (data and optimisation settings; every
knob's default is the first default model's recipe, see tools/README.md).

Every epoch writes OUT/last.pt atomically (model, EMA weights, optimiser,
scheduler, epoch, RNG states) and appends one line to OUT/log.txt; every
--val-every epochs it evaluates on the val list (or the held-out sequence) at
the model's working size (logits resized to the label size) and keeps
OUT/best.pt (best val mIoU; the EMA weights when EMA is on). --resume
continues from OUT/last.pt where it stopped.

--time-budget S stops after S seconds (counted from the start of this
process) at a step boundary, with the cosine schedule re-planned from the
measured step time to end there; last.pt then holds the final weights.
"""

import argparse
import contextlib
import copy
import json
import math
import os
import random
import sys
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from PIL import Image

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import mitaseg_ref as R  # noqa: E402
import make_splits  # noqa: E402



# ---------------------------------------------------------------- data

def load_config(path, depth=0):
    """A training config file. {"base": FILE, "train": {...}} is FILE (a path
    relative to this file's folder) with those train keys replaced, and its
    model unless "model" is given: a variant of a recipe names only what it
    changes, so the two cannot drift apart."""
    with open(path) as f:
        cfg = json.load(f)
    base = cfg.pop("base", None)
    if base is None:
        return cfg
    if depth >= 8:
        raise ValueError("%s: config bases nested more than 8 deep" % path)
    out = load_config(os.path.join(os.path.dirname(os.path.abspath(path)), base), depth + 1)
    out["train"] = dict(out.get("train", {}), **cfg.get("train", {}))
    if "model" in cfg:
        out["model"] = cfg["model"]
    return out


def data_pairs(root, tcfg, holdout=None):
    """(train pairs, val pairs, description). holdout = a sequence name: the
    leave-one-sequence-out fold over train_list + val_list (make_splits.py).
    train_list may be a list of list files: their union is trained on."""
    tl, vl = tcfg["train_list"], tcfg["val_list"]
    if holdout:
        if isinstance(tl, list):
            raise ValueError("holdout: train_list must be one list file")
        train, val = make_splits.fold(make_splits.pool_pairs(root, [tl, vl]), holdout)
        desc = "%s + %s minus sequence %s (%d frames); validated on %s (%d frames, a sequence never " \
               "trained on)" % (tl, vl, holdout, len(train), holdout, len(val))
        return train, val, desc
    # a list of lists trains on all of them (the final model: train + val)
    tls = tl if isinstance(tl, list) else [tl]
    train, val = make_splits.pool_pairs(root, tls), make_splits.read_list(os.path.join(root, vl))
    seen = {os.path.realpath(p[0]) for p in train}
    inside = sum(os.path.realpath(p[0]) in seen for p in val)
    # say so when the val frames are training frames: their number then
    # measures fit, not generalisation (and says so in the exported provenance)
    note = "" if inside == 0 else (", all in the training set" if inside == len(val)
                                   else ", %d of them in the training set" % inside)
    return train, val, "%s (%d frames); validated on %s (%d frames%s)" % (
        " + ".join(tls), len(train), vl, len(val), note)


def decode_all(pairs):
    """Decodes every image once: lists of uint8 tensors (3,H,W) and (H,W)."""
    imgs, labels = [], []
    for ip, lp in pairs:
        imgs.append(torch.from_numpy(np.array(Image.open(ip).convert("RGB"))).permute(2, 0, 1).contiguous())
        labels.append(torch.from_numpy(np.array(Image.open(lp))).contiguous())
    return imgs, labels


GRAY_W = (0.299, 0.587, 0.114)
# RGB <-> YIQ (NTSC): hue is a rotation of the (I, Q) chroma plane
_YIQ = torch.tensor([[0.299, 0.587, 0.114], [0.596, -0.274, -0.322], [0.211, -0.523, 0.312]])
_YIQ_INV = torch.linalg.inv(_YIQ)


def hue_rotate(img, turns):
    """Rotates the hue of a float (3,H,W) image by `turns` of a full circle (YIQ)."""
    a = 2 * math.pi * turns
    rot = torch.tensor([[1.0, 0.0, 0.0], [0.0, math.cos(a), -math.sin(a)], [0.0, math.sin(a), math.cos(a)]])
    m = _YIQ_INV @ rot @ _YIQ
    return torch.einsum("ij,jhw->ihw", m, img)


def gaussian_blur(img, sigma):
    """Separable Gaussian blur of a float (3,H,W) image (reflect padding)."""
    r = max(1, int(math.ceil(2 * sigma)))
    t = torch.arange(-r, r + 1, dtype=img.dtype)
    k = torch.exp(-0.5 * (t / sigma) ** 2)
    k = k / k.sum()
    x = img.unsqueeze(0)
    x = F.conv2d(F.pad(x, (r, r, 0, 0), mode="reflect"), k.view(1, 1, 1, -1).repeat(3, 1, 1, 1), groups=3)
    x = F.conv2d(F.pad(x, (0, 0, r, r), mode="reflect"), k.view(1, 1, -1, 1).repeat(3, 1, 1, 1), groups=3)
    return x[0]


def photometric(img, pm, rng):
    """Jitter of a float (3,H,W) image in [0,255], each kind with probability 1/2,
    in random order: brightness/contrast/saturation (factor 1 +- amount), gamma
    (exponent 1 +- amount), hue (rotation of +- amount turns)."""
    gray_w = torch.tensor(GRAY_W).view(3, 1, 1)
    kinds = ["brightness", "contrast", "saturation"] + [k for k in ("gamma", "hue") if pm.get(k, 0.0) > 0]
    for kind in rng.sample(kinds, len(kinds)):
        amt = pm.get(kind, 0.0)
        if amt <= 0 or rng.random() < 0.5:
            continue
        if kind == "hue":
            img = hue_rotate(img, rng.uniform(-amt, amt))
        else:
            f = rng.uniform(1 - amt, 1 + amt)
            if kind == "brightness":
                img = img * f
            elif kind == "contrast":
                m = (img * gray_w).sum(0).mean()
                img = (img - m) * f + m
            elif kind == "saturation":
                g = (img * gray_w).sum(0, keepdim=True)
                img = (img - g) * f + g
            else:
                img = 255.0 * (img / 255.0).clamp(min=0) ** f
        img = img.clamp(0, 255)
    return img


def augment(img, lab, tcfg, mcfg, rng):
    """Random scale (a factor of base_size), random crop (pad: 0 after
    normalising / ignore), hflip, photometric jitter, optional blur.
    Returns normalised float (3,ch,cw) and int64 label (ch,cw)."""
    ignore = mcfg["ignore_index"] if mcfg["ignore_index"] is not None else 255
    bh, bw = tcfg["base_size"]
    s = rng.uniform(*tcfg["scale_range"])
    nh, nw = max(1, int(round(bh * s))), max(1, int(round(bw * s)))
    x = F.interpolate(img.float().unsqueeze(0), size=(nh, nw), mode="bilinear",
                      align_corners=False)[0]
    y = F.interpolate(lab.float()[None, None], size=(nh, nw), mode="nearest")[0, 0].long()
    ch, cw = tcfg["crop"]
    # crop window (the image may be smaller than the crop: pad afterwards)
    top = rng.randint(0, max(0, nh - ch))
    left = rng.randint(0, max(0, nw - cw))
    x = x[:, top:top + ch, left:left + cw]
    y = y[top:top + ch, left:left + cw]
    if rng.random() < 0.5:
        x, y = x.flip(-1), y.flip(-1)
    x = photometric(x, tcfg.get("photometric", {}), rng)
    blur = tcfg.get("blur")
    if blur and rng.random() < blur.get("prob", 0.0):
        x = gaussian_blur(x, rng.uniform(*blur.get("sigma", [0.5, 1.5])))
    mean = torch.tensor(mcfg["input"]["mean"]).view(3, 1, 1)
    std = torch.tensor(mcfg["input"]["std"]).view(3, 1, 1)
    x = (x - mean) / std
    ph, pw = ch - x.shape[1], cw - x.shape[2]
    if ph > 0 or pw > 0:
        x = F.pad(x, (0, pw, 0, ph), value=0.0)
        y = F.pad(y, (0, pw, 0, ph), value=ignore)
    return x, y


@contextlib.contextmanager
def one_thread():
    """Runs the block at one intra-op thread, as in a DataLoader worker:
    PyTorch 2.x's bilinear F.interpolate differs in the last bit between 1
    and 2 threads, so samples made in the main process would differ."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(n)


class TrainSet(torch.utils.data.Dataset):
    """Augmented samples keyed by (image index, seed): each sample draws from
    its own random.Random(seed) and is made at one thread, so the batches do
    not depend on how many DataLoader workers make them (or none), and a
    resumed run draws the same."""

    def __init__(self, imgs, labels, tcfg, mcfg):
        self.imgs, self.labels, self.tcfg, self.mcfg = imgs, labels, tcfg, mcfg

    def __len__(self):
        return len(self.imgs)

    def __getitem__(self, key):
        j, seed = key
        with one_thread():
            return augment(self.imgs[j], self.labels[j], self.tcfg, self.mcfg, random.Random(seed))


class KeySampler(torch.utils.data.Sampler):
    """Yields the current epoch's keys (set by the training loop before each
    epoch); iterated in the main process, so persistent workers see new keys."""

    def __init__(self):
        self.keys = []

    def __iter__(self):
        return iter(list(self.keys))

    def __len__(self):
        return len(self.keys)


def mix_partners(n, prob, rng):
    """(i, j) for each sample i of a batch of n that, with probability prob,
    takes from another sample j; drawn in sample order from rng, lazily, so a
    caller's own draws for a pair come between (CutMix's box)."""
    for i in range(n):
        if rng.random() >= prob:
            continue
        yield i, (i + rng.randrange(1, n)) % n


def cutmix(x, y, cm, rng):
    """CutMix (Yun et al. 2019) for segmentation: with probability cm["prob"]
    each sample of the batch gets a box cut from another sample, image and
    labels alike; the box keeps a Beta(alpha, alpha) share lam of the sample,
    so it covers 1 - lam of the area. Mixes new street layouts and objects
    into scenes the training frames never showed together. rng: a
    random.Random (the box draws are reproducible on resume)."""
    if not cm or cm.get("prob", 0) <= 0 or x.shape[0] < 2:
        return x, y
    n, h, w = x.shape[0], x.shape[-2], x.shape[-1]
    alpha = cm.get("alpha", 1.0)
    src_x, src_y = x.clone(), y.clone()
    x, y = x.clone(), y.clone()
    for i, j in mix_partners(n, cm["prob"], rng):
        cut = math.sqrt(1.0 - rng.betavariate(alpha, alpha))
        bh, bw = int(round(h * cut)), int(round(w * cut))
        cy, cx = rng.randrange(h), rng.randrange(w)
        y0, y1 = max(cy - bh // 2, 0), min(cy - bh // 2 + bh, h)
        x0, x1 = max(cx - bw // 2, 0), min(cx - bw // 2 + bw, w)
        x[i, ..., y0:y1, x0:x1] = src_x[j, ..., y0:y1, x0:x1]
        y[i, y0:y1, x0:x1] = src_y[j, y0:y1, x0:x1]
    return x, y


def copy_paste(x, y, cp, class_ids, rng):
    """Copy-paste of chosen classes (Ghiasi et al. 2021, with ClassMix's
    label masks): with probability cp["prob"] each sample of the batch gets,
    from another sample, every pixel labelled one of class_ids (the config's
    cp["classes"], by name), image and label alike. The rare thin classes then
    appear on other streets, at other scales and in other light than the
    frames that have them. rng: a random.Random (reproducible on resume)."""
    if not cp or cp.get("prob", 0) <= 0 or x.shape[0] < 2 or not class_ids:
        return x, y
    ids = torch.tensor(class_ids, dtype=y.dtype)
    src_x, src_y = x.clone(), y.clone()
    x, y = x.clone(), y.clone()
    for i, j in mix_partners(x.shape[0], cp["prob"], rng):
        m = torch.isin(src_y[j], ids)     # (h, w)
        x[i][:, m] = src_x[j][:, m]
        y[i][m] = src_y[j][m]
    return x, y


def copy_paste_ids(tcfg, mcfg):
    """The class indices copy_paste takes, from the config's class names."""
    cp = tcfg.get("copy_paste")
    if not cp:
        return []
    names = mcfg["classes"]
    unknown = [c for c in cp.get("classes", []) if c not in names]
    if unknown:
        raise SystemExit("copy_paste.classes: %s not among the model's classes" % ", ".join(unknown))
    return [names.index(c) for c in cp.get("classes", [])]


def epoch_keys(rng, n, steps, bs):
    """(index, seed) for each sample of one epoch: a shuffled order, drop-last batches."""
    order = list(range(n))
    rng.shuffle(order)
    return [(j, rng.getrandbits(63)) for j in order[:steps * bs]]


# ---------------------------------------------------------------- loss

def class_pixel_stats(labels, K):
    """(pixels of each class, pixels of the images where each class appears)."""
    count = torch.zeros(K, dtype=torch.float64)
    present = torch.zeros(K, dtype=torch.float64)
    for lab in labels:
        h = torch.bincount(lab.flatten().long(), minlength=256)[:K].double()
        count += h
        present += (h > 0).double() * lab.numel()
    return count, present


def class_weights(tcfg, labels, K):
    """Loss weight per class, or None. "class_weighting" (a type or {"type", "clip"}):
      median_freq       median(f)/f_c, f_c = pixels of c / pixels of images with c (SegNet)
      median_freq_clip  the same, clipped to clip = [lo, hi] (default [0.5, 3])
      sqrt_inv_freq     1/sqrt(share of c), scaled so the pixel-weighted mean is 1;
                        clipped when clip is given
      none              no weights
    Without "class_weighting": the fixed list "class_weights" (the first default
    model's median-frequency weights), or none. Computed on the training split's
    labels; classes with no pixels get weight 0 (they never occur in the loss)."""
    spec = tcfg.get("class_weighting")
    if spec is None:
        cw = tcfg.get("class_weights")
        return torch.tensor(cw, dtype=torch.float32) if cw else None
    if isinstance(spec, str):
        spec = {"type": spec}
    kind = spec["type"]
    if kind == "none":
        return None
    count, present = class_pixel_stats(labels, K)
    seen = count > 0
    w = torch.zeros(K, dtype=torch.float64)
    clip = spec.get("clip")
    if kind in ("median_freq", "median_freq_clip"):
        f = count[seen] / present[seen]
        w[seen] = f.median() / f
        if kind == "median_freq_clip":
            clip = clip or [0.5, 3.0]
    elif kind == "sqrt_inv_freq":
        share = count[seen] / count.sum()
        w[seen] = share.rsqrt()
        w[seen] /= (share * w[seen]).sum()
    else:
        raise ValueError("class_weighting type must be median_freq, median_freq_clip, sqrt_inv_freq or none")
    if clip:
        w[seen] = w[seen].clamp(clip[0], clip[1])
    return w.float()


def lovasz_grad(gt_sorted):
    """Gradient of the Lovász extension of the Jaccard loss for errors sorted
    in descending order (Berman et al. 2018, Alg. 1). gt_sorted (P,) 0/1."""
    gts = gt_sorted.sum()
    inter = gts - gt_sorted.cumsum(0)
    union = gts + (1 - gt_sorted).cumsum(0)
    jac = 1.0 - inter / union
    jac[1:] = jac[1:] - jac[:-1]
    return jac


def lovasz_softmax(probs, labels, ignore):
    """Lovász-softmax loss: mean over the classes present in labels of the
    Lovász extension of 1 - IoU. probs (B,K,H,W) softmax, labels (B,H,W)."""
    K = probs.shape[1]
    p = probs.permute(0, 2, 3, 1).reshape(-1, K)
    y = labels.reshape(-1)
    keep = (y != ignore) & (y < K)
    p, y = p[keep], y[keep]
    losses = []
    for c in range(K):
        fg = (y == c).float()
        if fg.sum() == 0:
            continue
        err = (fg - p[:, c]).abs()
        err_sorted, perm = torch.sort(err, descending=True)
        losses.append(torch.dot(err_sorted, lovasz_grad(fg[perm])))
    return torch.stack(losses).mean() if losses else probs.sum() * 0.0


class SegLoss(nn.Module):
    """Cross-entropy (class weights, ignore) with optional OHEM, plus an
    optional Lovász-softmax term.

    ohem {"thresh", "min_kept"}: only the pixels whose probability of the true
    class is below thresh, but at least the min_kept hardest (mmseg's
    OHEMPixelSampler); the kept pixels' weighted mean."""

    def __init__(self, weight, ignore, ohem=None, lovasz_weight=0.0):
        super().__init__()
        self.register_buffer("weight", weight if weight is not None else None)
        self.ignore, self.ohem, self.lovasz_weight = ignore, ohem, lovasz_weight

    def forward(self, logits, y):
        if not self.ohem:
            loss = F.cross_entropy(logits, y, weight=self.weight, ignore_index=self.ignore)
        else:
            per = F.cross_entropy(logits, y, weight=None, ignore_index=self.ignore, reduction="none")
            valid = y != self.ignore
            with torch.no_grad():
                prob = torch.exp(-per)                  # softmax probability of the true class
                p = prob[valid]
                thresh = self.ohem.get("thresh", 0.7)
                min_kept = min(int(self.ohem.get("min_kept", 100000)), p.numel())
                if min_kept > 0:
                    thresh = max(thresh, p.kthvalue(min_kept).values.item())
                kept = valid & (prob <= thresh)
            w = self.weight[y.clamp(0, logits.shape[1] - 1)] if self.weight is not None else torch.ones_like(per)
            w = w * kept
            loss = (per * w).sum() / w.sum().clamp(min=1e-12)
        if self.lovasz_weight:
            loss = loss + self.lovasz_weight * lovasz_softmax(torch.softmax(logits, 1), y, self.ignore)
        return loss


# ---------------------------------------------------------------- model

class AuxHead(nn.Module):
    """Training-only FCN head on a backbone tap: 3x3 ConvModule, dropout, 1x1."""

    def __init__(self, cin, ch, n_classes):
        super().__init__()
        self.conv = R.ConvModule(cin, ch, 3, padding=1)
        self.dropout = nn.Dropout2d(0.1)
        self.conv_seg = nn.Conv2d(ch, n_classes, 1)

    def forward(self, x):
        return self.conv_seg(self.dropout(self.conv(x)))


class ModelEMA:
    """Exponential moving average of a model's parameters and buffers; the
    decay ramps up as min(decay, (1 + n) / (10 + n)) over the first updates
    so that a short run's average is not dominated by the random init."""

    def __init__(self, model, decay):
        self.module = copy.deepcopy(model).eval()
        for p in self.module.parameters():
            p.requires_grad_(False)
        self.decay, self.updates = decay, 0

    @torch.no_grad()
    def update(self, model):
        self.updates += 1
        d = min(self.decay, (1 + self.updates) / (10 + self.updates))
        src = model.state_dict()
        for k, v in self.module.state_dict().items():
            if v.dtype.is_floating_point:
                v.mul_(d).add_(src[k].detach(), alpha=1 - d)
            else:
                v.copy_(src[k])


def new_model(mcfg):
    """The reference model with timm-like init: truncated normal for linear
    layers and pos_embed (PyTorch's defaults elsewhere)."""
    model = R.MitaSeg(mcfg)
    for m in model.modules():
        if isinstance(m, nn.Linear):
            nn.init.trunc_normal_(m.weight, std=0.02)
            nn.init.zeros_(m.bias)
    nn.init.trunc_normal_(model.backbone.pos_embed, std=0.02)
    return model


def set_drop_path(model, rate):
    """Stochastic depth, the rate rising linearly from 0 at the first block to
    rate at the last (DeiT's schedule); training mode only."""
    blocks = model.backbone.blocks
    for i, blk in enumerate(blocks):
        blk.drop_path = rate * i / max(1, len(blocks) - 1)


def layer_id(name, depth):
    """Depth of a MitaSeg parameter for layer-wise lr decay: 0 the stem and
    embeddings, i + 1 block i, depth + 1 everything after the blocks (the
    final norm, neck, head)."""
    if name.startswith("backbone.blocks."):
        return int(name.split(".")[2]) + 1
    if name.startswith(("backbone.stem.", "backbone.patch_embed.", "backbone.pos_embed",
                        "backbone.cls_token")):
        return 0
    return depth + 1


def param_groups(modules, wd, lr=None, layer_decay=None):
    """AdamW groups: no weight decay on biases, norms and pos_embed. With
    layer_decay (and lr), modules[0] being the MitaSeg, its parameters at
    depth i (layer_id) get lr x layer_decay^(depth + 1 - i) (BEiT/MAE
    fine-tuning: the blocks nearer the input, pretrained, move least); the
    other modules (the auxiliary head) the full lr."""
    groups = {}
    depth = len(modules[0].backbone.blocks) if layer_decay else 0
    for mi, m in enumerate(modules):
        for name, p in m.named_parameters():
            if not p.requires_grad:
                continue
            nd = p.ndim <= 1 or name.endswith("pos_embed")
            lid = layer_id(name, depth) if layer_decay and mi == 0 else depth + 1
            g = groups.setdefault((lid, nd), {"params": [], "weight_decay": 0.0 if nd else wd})
            if layer_decay:
                g["lr"] = lr * layer_decay ** (depth + 1 - lid)
            g["params"].append(p)
    # the full-lr decayed group first: the log reports param_groups[0]["lr"]
    return [groups[k] for k in sorted(groups, key=lambda k: (k[1], -k[0]))]


class WarmupCosine:
    """LR factor: linear warm-up, then cosine to min_ratio at step `total`.
    An object (not a closure) so LambdaLR's state_dict keeps `total`, which a
    time budget re-plans during the run."""

    def __init__(self, warmup, total, min_ratio):
        self.warmup, self.total, self.min_ratio = warmup, total, min_ratio

    def __call__(self, step):
        if step < self.warmup:
            return 1e-3 + (1 - 1e-3) * step / max(1, self.warmup)
        t = min(1.0, (step - self.warmup) / max(1, self.total - self.warmup))
        return self.min_ratio + (1 - self.min_ratio) * 0.5 * (1 + math.cos(math.pi * t))


class BudgetPlan:
    """Plans how many steps fit in a wall-clock budget.

    plan(now, step, sec_per_step, reserve) -> total steps: the steps done plus
    as many as fit in what is left after `reserve` seconds (the final
    validation and checkpoint), at least one more. after_step() is the
    training loops' bookkeeping around it."""

    def __init__(self, budget, t_start, max_steps):
        self.budget, self.t_start, self.max_steps = budget, t_start, max_steps
        self.t_first = self.step_first = self.first_cost = self.sec_step = None

    def plan(self, now, step, sec_per_step, reserve):
        left = self.budget - (now - self.t_start) - reserve
        more = int(left / max(sec_per_step, 1e-9))
        return max(step + 1, min(self.max_steps, step + more))

    def over(self, now, reserve):
        return now - self.t_start + reserve >= self.budget

    def step_cost(self):
        """Seconds a step: measured since this process's first step (which
        allocates and autotunes; validations and checkpoints included), or
        that first step's cost until a second one is done."""
        return self.sec_step or self.first_cost

    def after_step(self, now, step, t_epoch, epoch_end, reserve_fn, sched_fn):
        """Called after each step: re-plans sched_fn.total (after the 2nd and
        10th steps and at each epoch's end) with reserve_fn(step_cost())
        seconds held back; True when the loop should stop (the plan's end, or
        one more step would cross the budget)."""
        if self.t_first is None:
            self.t_first, self.step_first, self.first_cost = now, step, now - t_epoch
        elif step > self.step_first:
            self.sec_step = (now - self.t_first) / (step - self.step_first)
        reserve = reserve_fn(self.step_cost())
        if self.sec_step is not None and (step - self.step_first in (2, 10) or epoch_end):
            sched_fn.total = self.plan(now, step, self.sec_step, reserve)
        return step >= sched_fn.total or self.over(now, reserve + self.step_cost())


def rng_state(rng, device):
    """Every random stream a run draws from, for its checkpoint."""
    return {"python": rng.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state_all() if device.type == "cuda" else None}


def rng_restore(rng, state, device):
    """rng_state()'s inverse (CUDA's only on CUDA, when saved there)."""
    rng.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if device.type == "cuda" and state.get("cuda") is not None:
        torch.cuda.set_rng_state_all(state["cuda"])


# ---------------------------------------------------------------- device

def pick_device(pref="auto"):
    """'auto': CUDA when PyTorch sees a GPU, else the CPU."""
    if pref == "auto":
        pref = "cuda" if torch.cuda.is_available() else "cpu"
    if pref == "cuda" and not torch.cuda.is_available():
        raise SystemExit("train.py: --device cuda but PyTorch sees no GPU")
    return torch.device(pref)


def precision_plan(device, tcfg, amp=None):
    """{"amp_dtype": torch.bfloat16 or None, "channels_last": bool}.
    amp ("auto", "bf16", "off"; the config's "amp" when None): auto = bf16 on
    CUDA (no loss scaling needed, unlike fp16), off on the CPU. Channels-last
    convolutions ("channels_last": auto) on CUDA (cuDNN's fast layout for the
    stem/neck/head convs) and with bf16 on the CPU (oneDNN's: 3 training
    steps of the xseq recipe, 1 thread, took 52-53 s against 61-64 s)."""
    amp = amp or tcfg.get("amp", "auto")
    if amp not in ("auto", "bf16", "off"):
        raise ValueError("amp must be auto, bf16 or off")
    bf16 = amp == "bf16" or (amp == "auto" and device.type == "cuda")
    cl = tcfg.get("channels_last", "auto")
    return {"amp_dtype": torch.bfloat16 if bf16 else None,
            "channels_last": cl is True or (cl == "auto" and (device.type == "cuda" or bf16))}


def autocast(device, plan):
    if plan["amp_dtype"] is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=plan["amp_dtype"])


def place(modules, device, plan):
    for m in modules:
        m.to(device)
        if plan["channels_last"]:
            m.to(memory_format=torch.channels_last)


def to_input(x, device, plan):
    x = x.to(device, non_blocking=True)
    return x.contiguous(memory_format=torch.channels_last) if plan["channels_last"] else x


def forward_losses(model, aux, aux_tap, criterion, x, y, device, plan):
    """(main loss, auxiliary loss) of one batch: the forward under the run's
    autocast, both logits resized to the labels' size in fp32 (one training
    step's forward; bench/bench_train.py times the same)."""
    with autocast(device, plan):
        stages = {}
        head = model(x, stages=stages)
        aux_logits = aux(stages["taps.%d" % aux_tap])
    head = F.interpolate(head.float(), size=y.shape[-2:], mode="bilinear", align_corners=False)
    aux_logits = F.interpolate(aux_logits.float(), size=y.shape[-2:], mode="bilinear",
                               align_corners=False)
    return criterion(head, y), criterion(aux_logits, y)


def loader_workers(tcfg, device):
    """DataLoader workers: the config's "workers", or "auto" = 0 on the CPU
    (augmenting in the training process; the CPU machine is shared) and up to
    8 on CUDA."""
    w = tcfg.get("workers", "auto")
    if w == "auto":
        return 0 if device.type == "cpu" else max(1, min(8, (os.cpu_count() or 2) - 1))
    return int(w)


# ---------------------------------------------------------------- eval

@torch.no_grad()
def evaluate(model, imgs, labels, mcfg, device, batch, plan=None):
    """mIoU / aAcc over the classes, logits at the working size resized to label size."""
    plan = plan or {"amp_dtype": None, "channels_last": False}
    model.eval()
    K = len(mcfg["classes"])
    ignore = mcfg["ignore_index"]
    conf = torch.zeros(K, K, dtype=torch.int64)
    i = 0
    while i < len(imgs):
        group = list(range(i, min(i + batch, len(imgs))))
        # images of one size batch together; otherwise one at a time
        sizes = {tuple(imgs[j].shape) for j in group}
        if len(sizes) > 1:
            group = [i]
        xs = []
        for j in group:
            x, rsize = R.preprocess(imgs[j].permute(1, 2, 0).numpy(), mcfg)
            xs.append(x)
        x = to_input(torch.cat(xs), device, plan)
        with autocast(device, plan):
            head = model(x)
        H, W = labels[group[0]].shape
        logits, _ = R.postprocess(head.float(), x.shape[-2:], rsize, (H, W))
        pred = logits.argmax(1).cpu()
        for b, j in enumerate(group):
            gt = labels[j].long().flatten()
            pr = pred[b].flatten()
            keep = gt != ignore if ignore is not None else torch.ones_like(gt, dtype=torch.bool)
            keep &= gt < K
            conf += torch.bincount(gt[keep] * K + pr[keep], minlength=K * K).view(K, K)
        i += len(group)
    tp = conf.diag().double()
    union = conf.sum(0).double() + conf.sum(1).double() - tp
    present = conf.sum(1) > 0
    iou = torch.where(union > 0, tp / union.clamp(min=1), torch.zeros_like(tp))
    miou = iou[present].mean().item() * 100
    aacc = (tp.sum() / conf.sum().clamp(min=1)).item() * 100
    return miou, aacc, (iou * 100).tolist()


# ---------------------------------------------------------------- main

def atomic_save(obj, path):
    tmp = path + ".tmp"
    torch.save(obj, tmp)
    os.replace(tmp, path)


def log_line(out_dir, text):
    print(text, flush=True)
    with open(os.path.join(out_dir, "log.txt"), "a") as f:
        f.write(text + "\n")


def run_setup(args, tcfg):
    """What a run (train.py, pretrain.py) sets up from its arguments
    (--out, --threads, --device, --amp, --data-root, --holdout) and config:
    OUT made, threads, device and precision, seeds. Returns (device, plan,
    seed, rng, data root, holdout sequence or None)."""
    os.makedirs(args.out, exist_ok=True)
    torch.set_num_threads(args.threads or tcfg.get("threads", 2))
    device = pick_device(args.device)
    plan = precision_plan(device, tcfg, args.amp)
    if device.type == "cuda":
        torch.backends.cudnn.benchmark = True
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    seed = tcfg.get("seed", 0)
    rng = random.Random(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    root = args.data_root or tcfg["data_root"]
    holdout = args.holdout if args.holdout is not None else tcfg.get("holdout")
    holdout = None if holdout in (None, "", "none") else holdout
    return device, plan, seed, rng, root, holdout


def main(argv=None):
    t_start = time.time()
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--epochs", type=int, default=60,
                    help="epochs of the schedule (with --time-budget: the most)")
    ap.add_argument("--resume", action="store_true", help="continue from OUT/last.pt")
    ap.add_argument("--val-every", type=int, default=None)
    ap.add_argument("--max-steps", type=int, default=0, help="stop each epoch after N steps (timing tests)")
    ap.add_argument("--no-val", action="store_true")
    ap.add_argument("--data-root", default=None,
                    help="data folder (default: the config's data_root), e.g. a tools/pack_data.py pack")
    ap.add_argument("--holdout", default=None,
                    help="leave-one-sequence-out fold: train on train_list + val_list minus sequence SEQ, "
                         "validate on SEQ (default: the config's 'holdout'; 'none': the plain lists)")
    ap.add_argument("--time-budget", type=float, default=0,
                    help="stop after SECONDS (from process start), the cosine planned to end there")
    ap.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    ap.add_argument("--amp", default=None, choices=["auto", "bf16", "off"],
                    help="mixed precision (default: the config's 'amp', else auto = bf16 on CUDA)")
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: the config's)")
    ap.add_argument("--init-model", default=None,
                    help="start from a mitaseg model file (e.g. the shipped default model) with the "
                         "same architecture: continues training without a checkpoint; ignored with --resume")
    ap.add_argument("--init-backbone", default=None,
                    help="start the backbone from a `convert.py timm` file (ignored with --resume); "
                         "its position embedding is resampled to pos_grid as timm would "
                         "(bicubic with antialias)")
    args = ap.parse_args(argv)
    R.TRAIN_TOPK = True   # topk for the stable sort in training steps (mitaseg_ref)

    full_cfg = load_config(args.config)
    mcfg = R.complete_config(full_cfg["model"])
    tcfg = full_cfg["train"]
    paste_ids = copy_paste_ids(tcfg, mcfg)
    val_every = args.val_every or tcfg.get("val_every", 3)
    device, plan, seed, rng, root, holdout = run_setup(args, tcfg)
    t0 = time.time()
    train_pairs, val_pairs, data_desc = data_pairs(root, tcfg, holdout)
    train_imgs, train_labels = decode_all(train_pairs)
    val_imgs, val_labels = decode_all(val_pairs)
    print("decoded %d train + %d val images in %.1fs (%s; device %s, amp %s, channels-last %s)"
          % (len(train_imgs), len(val_imgs), time.time() - t0, data_desc, device,
             plan["amp_dtype"], plan["channels_last"]), flush=True)

    model = new_model(mcfg)
    if args.init_model and not args.resume:
        src = R.load_model(args.init_model)
        want = model.state_dict()
        for k, v in src.state_dict().items():
            if k not in want or want[k].shape != v.shape:
                raise SystemExit("%s: tensor %s does not fit the config's model" % (args.init_model, k))
        # a model without the neck's stem skips grows them: zero 1x1 convs,
        # so training starts from exactly the given model's function
        new = sorted(k for k in want if k not in src.state_dict())
        if any(not k.startswith("neck.stem_convs.") for k in new):
            raise SystemExit("%s: the config's model has tensors the file lacks: %s" % (
                args.init_model, ", ".join(k for k in new if not k.startswith("neck.stem_convs."))))
        model.load_state_dict(src.state_dict(), strict=not new)
        with torch.no_grad():
            for k in new:
                want[k].zero_()
        log_line(args.out, "# model from %s%s" % (args.init_model,
                                                  " (new, zero: %s)" % ", ".join(new) if new else ""))
    if args.init_backbone and not args.resume:
        import convert
        loaded, skipped = convert.init_backbone(model, args.init_backbone)
        log_line(args.out, "# backbone from %s: %d tensors, skipped %s"
                 % (args.init_backbone, len(loaded), " ".join(skipped) or "none"))
    K = len(mcfg["classes"])
    aux = AuxHead(mcfg["backbone"]["embed_dim"], tcfg.get("aux_channels", 64), K)
    set_drop_path(model, float(tcfg.get("drop_path", 0.0)))
    place([model, aux], device, plan)
    ema = ModelEMA(model, tcfg["ema"]) if tcfg.get("ema") else None

    bs = tcfg["batch_size"]
    steps_per_epoch = len(train_imgs) // bs
    if args.max_steps:
        steps_per_epoch = min(steps_per_epoch, args.max_steps)
    total = args.epochs * steps_per_epoch
    opt = torch.optim.AdamW(param_groups([model, aux], tcfg["weight_decay"], tcfg["lr"],
                                         tcfg.get("layer_decay")), lr=tcfg["lr"],
                            betas=(0.9, 0.999))
    sched_fn = WarmupCosine(tcfg.get("warmup_steps", 100), total, tcfg.get("min_lr_ratio", 0.01))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, sched_fn)
    # bf16 needs no loss scaling; the (disabled) scaler keeps checkpoints' layout.
    # torch.amp.GradScaler on PyTorch 2.3+ (torch.cuda.amp's is deprecated there)
    scaler = (torch.amp.GradScaler("cuda", enabled=False) if hasattr(torch.amp, "GradScaler")
              else torch.cuda.amp.GradScaler(enabled=False))

    ignore = mcfg["ignore_index"] if mcfg["ignore_index"] is not None else 255
    weight = class_weights(tcfg, train_labels, K)
    criterion = SegLoss(weight, ignore, tcfg.get("ohem"), tcfg.get("lovasz_weight", 0.0)).to(device)
    aux_w = tcfg.get("aux_weight", 0.4)
    aux_tap = tcfg.get("aux_tap", 2)

    start_epoch, best, step = 0, -1.0, 0
    init_from = None if args.resume else (args.init_model or args.init_backbone)
    last_path = os.path.join(args.out, "last.pt")
    if args.resume:
        import convert
        ck = convert.load_checkpoint(last_path)   # weights_only=False: RNG states are pickles
        model.load_state_dict(ck["model"])
        aux.load_state_dict(ck["aux"])
        opt.load_state_dict(ck["optimizer"])
        sched.load_state_dict(ck["scheduler"])
        sched_fn = sched.lr_lambdas[0]
        sched_fn.total = total      # --epochs may extend the schedule; a budget re-plans it
        if ema is not None and ck.get("ema") is not None:
            ema.module.load_state_dict(ck["ema"])
            ema.updates = ck.get("ema_updates", 0)
        elif ema is not None:     # a run without EMA so far: average from its weights
            ema = ModelEMA(model, tcfg["ema"])
        start_epoch, best = ck["epoch"], ck.get("best_miou", -1.0)
        init_from = ck.get("init")
        step = ck.get("step", start_epoch * steps_per_epoch)
        rng_restore(rng, ck["rng"], device)
        print("resumed from %s at epoch %d (best mIoU %.2f)" % (last_path, start_epoch, best), flush=True)
    else:
        log_line(args.out, "# config %s: %s" % (args.config, json.dumps(tcfg)))
        log_line(args.out, "# data %s: %s" % (root, data_desc))
        if weight is not None:
            log_line(args.out, "# class weights %s" % " ".join("%.3f" % v for v in weight.tolist()))

    budget = BudgetPlan(args.time_budget, t_start, total) if args.time_budget else None
    eval_model = ema.module if ema is not None else model
    dataset = TrainSet(train_imgs, train_labels, tcfg, mcfg)
    workers = loader_workers(tcfg, device)
    # one loader for the run (workers persist across epochs); the sampler
    # hands it each epoch's keys
    sampler = KeySampler()
    loader = torch.utils.data.DataLoader(dataset, batch_size=bs, sampler=sampler, num_workers=workers,
                                         pin_memory=device.type == "cuda", drop_last=True,
                                         persistent_workers=workers > 0)
    sec_val = 0.0          # measured cost of one validation (budget reserve)

    def val_guess(sec_step):
        """Before the first validation: forward-only (~1/3 of a step) over the
        val images at the base size."""
        if args.no_val or sec_step is None:
            return 0.0
        bh, bw = tcfg["base_size"]
        ch, cw = tcfg["crop"]
        return sec_step / 3 * len(val_imgs) / bs * (bh * bw) / (ch * cw)

    def reserve(sec_step):
        """Seconds a budget holds back: the final validation and checkpoint."""
        return 1.5 * (sec_val or val_guess(sec_step)) + min(5.0, 0.1 * args.time_budget) + 0.02 * args.time_budget
    stop = False
    for epoch in range(start_epoch, args.epochs):
        model.train()
        aux.train()
        t_ep = time.time()
        sampler.keys = epoch_keys(rng, len(train_imgs), steps_per_epoch, bs)
        # losses summed on the device: no host sync per step (checked once per epoch)
        sum_loss = torch.zeros((), device=device)
        sum_aux = torch.zeros((), device=device)
        n_steps = 0
        for x, y in loader:
            x, y = cutmix(x, y, tcfg.get("cutmix"), random.Random(seed * 1000003 + step))
            x, y = copy_paste(x, y, tcfg.get("copy_paste"), paste_ids,
                              random.Random(seed * 1000033 + step))
            x, y = to_input(x, device, plan), y.to(device, non_blocking=True)
            loss_main, loss_aux = forward_losses(model, aux, aux_tap, criterion, x, y, device, plan)
            loss = loss_main + aux_w * loss_aux
            opt.zero_grad(set_to_none=True)
            loss.backward()
            if tcfg.get("grad_clip"):
                torch.nn.utils.clip_grad_norm_(list(model.parameters()) + list(aux.parameters()),
                                               tcfg["grad_clip"])
            opt.step()
            sched.step()
            if ema is not None:
                ema.update(model)
            step += 1
            n_steps += 1
            sum_loss += loss_main.detach()
            sum_aux += loss_aux.detach()
            if budget is not None:
                if budget.after_step(time.time(), step, t_ep, n_steps == steps_per_epoch, reserve, sched_fn):
                    stop = True
                    break
        sum_loss, sum_aux = sum_loss.item(), sum_aux.item()
        if not (math.isfinite(sum_loss) and math.isfinite(sum_aux)):
            log_line(args.out, "non-finite loss in epoch %d; stopping (last.pt is the epoch before)" % (epoch + 1))
            return 1
        secs = time.time() - t_ep
        n = max(1, n_steps)
        done = epoch + 1
        line = "epoch %d/%d loss %.4f aux %.4f lr %.3e time %.0fs" % (
            done, args.epochs, sum_loss / n, sum_aux / n, opt.param_groups[0]["lr"], secs)
        if budget is not None:
            line += " step %d/%d (budget %.0fs, %.0fs used)" % (step, sched_fn.total, args.time_budget,
                                                               time.time() - t_start)
        miou = None
        want_val = not args.no_val and (done % val_every == 0 or done == args.epochs or stop)
        if want_val and stop and budget.over(time.time(), sec_val or val_guess(budget.step_cost())):
            # a budget too short for the model on this device (a CPU rehearsal)
            line += " (final validation skipped: it would not fit in the time budget)"
            want_val = False
        if want_val:
            tv = time.time()
            miou, aacc, ious = evaluate(eval_model, val_imgs, val_labels, mcfg, device,
                                        tcfg.get("val_batch", 4), plan)
            sec_val = time.time() - tv
            if miou > best:
                best = miou
                atomic_save({"model": eval_model.state_dict(), "model_config": mcfg, "epoch": done,
                             "val_miou": miou, "val_aacc": aacc, "val_ious": ious,
                             "config_path": args.config, "data": data_desc, "train_config": tcfg,
                             "init": init_from},
                            os.path.join(args.out, "best.pt"))
            line += " val mIoU %.2f aAcc %.2f (best %.2f, val %.0fs) ious %s" % (
                miou, aacc, best, sec_val, " ".join("%.1f" % v for v in ious))
        atomic_save({
            "model": model.state_dict(), "aux": aux.state_dict(), "optimizer": opt.state_dict(),
            "scheduler": sched.state_dict(), "scaler": scaler.state_dict(), "epoch": done, "step": step,
            "ema": ema.module.state_dict() if ema is not None else None,
            "ema_updates": ema.updates if ema is not None else 0,
            "best_miou": best, "model_config": mcfg, "train_config": tcfg, "config_path": args.config,
            "data": data_desc, "init": init_from,
            "rng": rng_state(rng, device),
        }, last_path)
        log_line(args.out, line)
        if stop:
            log_line(args.out, "# time budget: stopped after %d steps, %.0fs" % (step, time.time() - t_start))
            break
    return 0


if __name__ == "__main__":
    sys.exit(main())
