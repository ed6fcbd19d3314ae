#!/usr/bin/python3
"""Train the mitaseg reference model (tools/mitaseg_ref.py) on CamVid-style lists.

  /usr/bin/python3 tools/train.py --config tools/configs/camvid-mita.json \
      --out /work/runs/camvid-mita --epochs 60 [--resume]

The config file has two parts: "model" (the model-format.md config, stored in
the exported model file) and "train" (data and optimisation settings).

Every epoch writes OUT/last.pt atomically (model, optimiser, scheduler,
epoch, RNG states) and appends one line to OUT/log.txt; every --val-every
epochs it evaluates on the val list at the model's working size (logits
resized to the label size) and keeps OUT/best.pt (best val mIoU).
--resume continues from OUT/last.pt exactly where it stopped.
"""

import argparse
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


# ---------------------------------------------------------------- data

def read_list(list_path):
    """`image label` lines, paths relative to the list file's folder."""
    root = os.path.dirname(os.path.abspath(list_path))
    pairs = []
    with open(list_path) as f:
        for line in f:
            parts = line.split()
            if len(parts) >= 2:
                pairs.append((os.path.join(root, parts[0]), os.path.join(root, parts[1])))
    return pairs


def decode_all(pairs):
    """Decodes every image once: lists of uint8 tensors (3,H,W) and (H,W)."""
    imgs, labels = [], []
    for ip, lp in pairs:
        imgs.append(torch.from_numpy(np.array(Image.open(ip).convert("RGB"))).permute(2, 0, 1).contiguous())
        labels.append(torch.from_numpy(np.array(Image.open(lp))).contiguous())
    return imgs, labels


def photometric(img, pm, rng):
    """Brightness/contrast/saturation jitter on a float (3,H,W) image in [0,255]."""
    gray_w = torch.tensor([0.299, 0.587, 0.114]).view(3, 1, 1)
    for kind in rng.sample(["brightness", "contrast", "saturation"], 3):
        amt = pm.get(kind, 0.0)
        if amt <= 0 or rng.random() < 0.5:
            continue
        f = rng.uniform(1 - amt, 1 + amt)
        if kind == "brightness":
            img = img * f
        elif kind == "contrast":
            m = (img * gray_w).sum(0).mean()
            img = (img - m) * f + m
        else:
            g = (img * gray_w).sum(0, keepdim=True)
            img = (img - g) * f + g
        img = img.clamp(0, 255)
    return img


def augment(img, lab, tcfg, mcfg, rng):
    """Random scale, random crop (pad: 0 after normalising / ignore), hflip, jitter.
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
    mean = torch.tensor(mcfg["input"]["mean"]).view(3, 1, 1)
    std = torch.tensor(mcfg["input"]["std"]).view(3, 1, 1)
    x = (x - mean) / std
    ph, pw = ch - x.shape[1], cw - x.shape[2]
    if ph > 0 or pw > 0:
        x = F.pad(x, (0, pw, 0, ph), value=0.0)
        y = F.pad(y, (0, pw, 0, ph), value=ignore)
    return x, y


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


def param_groups(modules, wd):
    decay, no_decay = [], []
    for m in modules:
        for name, p in m.named_parameters():
            if not p.requires_grad:
                continue
            (no_decay if p.ndim <= 1 or name.endswith("pos_embed") else decay).append(p)
    return [{"params": decay, "weight_decay": wd}, {"params": no_decay, "weight_decay": 0.0}]


def lr_lambda_factory(warmup, total, min_ratio):
    def f(step):
        if step < warmup:
            return 1e-3 + (1 - 1e-3) * step / max(1, warmup)
        t = min(1.0, (step - warmup) / max(1, total - warmup))
        return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * t))
    return f


# ---------------------------------------------------------------- eval

@torch.no_grad()
def evaluate(model, imgs, labels, mcfg, device, batch, use_amp):
    """mIoU / aAcc over the classes, logits at the working size resized to label size."""
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
        x = torch.cat(xs).to(device)
        with torch.autocast(device_type="cuda", enabled=use_amp):
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


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--epochs", type=int, default=60)
    ap.add_argument("--resume", action="store_true", help="continue from OUT/last.pt")
    ap.add_argument("--val-every", type=int, default=None)
    ap.add_argument("--max-steps", type=int, default=0, help="stop each epoch after N steps (timing tests)")
    ap.add_argument("--no-val", action="store_true")
    ap.add_argument("--init-model", default=None,
                    help="start from a mitaseg model file (e.g. the shipped default model) with the "
                         "same architecture: continues training without a checkpoint; ignored with --resume")
    ap.add_argument("--init-backbone", default=None,
                    help="start the backbone from a `convert.py timm` file (ignored with --resume); "
                         "its position embedding is resampled to pos_grid as timm would "
                         "(bicubic with antialias)")
    args = ap.parse_args()

    full_cfg = json.load(open(args.config))
    mcfg = R.complete_config(full_cfg["model"])
    tcfg = full_cfg["train"]
    val_every = args.val_every or tcfg.get("val_every", 3)
    os.makedirs(args.out, exist_ok=True)
    torch.set_num_threads(tcfg.get("threads", 2))
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    use_amp = device.type == "cuda"

    seed = tcfg.get("seed", 0)
    rng = random.Random(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)

    root = tcfg["data_root"]
    t0 = time.time()
    train_imgs, train_labels = decode_all(read_list(os.path.join(root, tcfg["train_list"])))
    val_imgs, val_labels = decode_all(read_list(os.path.join(root, tcfg["val_list"])))
    print("decoded %d train + %d val images in %.1fs" % (len(train_imgs), len(val_imgs), time.time() - t0),
          flush=True)

    model = R.MitaSeg(mcfg)
    # timm-like init: truncated normal for linear layers and pos_embed
    for m in model.modules():
        if isinstance(m, nn.Linear):
            nn.init.trunc_normal_(m.weight, std=0.02)
            nn.init.zeros_(m.bias)
    nn.init.trunc_normal_(model.backbone.pos_embed, std=0.02)
    if args.init_model and not args.resume:
        src = R.load_model(args.init_model)
        want = model.state_dict()
        for k, v in src.state_dict().items():
            if k not in want or want[k].shape != v.shape:
                raise SystemExit("%s: tensor %s does not fit the config's model" % (args.init_model, k))
        model.load_state_dict(src.state_dict())
        log_line(args.out, "# model from %s" % args.init_model)
    if args.init_backbone and not args.resume:
        import convert
        loaded, skipped = convert.init_backbone(model, args.init_backbone)
        log_line(args.out, "# backbone from %s: %d tensors, skipped %s"
                 % (args.init_backbone, len(loaded), " ".join(skipped) or "none"))
    K = len(mcfg["classes"])
    aux = AuxHead(mcfg["backbone"]["embed_dim"], tcfg.get("aux_channels", 64), K)
    model.to(device)
    aux.to(device)

    bs = tcfg["batch_size"]
    steps_per_epoch = len(train_imgs) // bs
    if args.max_steps:
        steps_per_epoch = min(steps_per_epoch, args.max_steps)
    total = args.epochs * steps_per_epoch
    opt = torch.optim.AdamW(param_groups([model, aux], tcfg["weight_decay"]), lr=tcfg["lr"],
                            betas=(0.9, 0.999))
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lr_lambda_factory(tcfg.get("warmup_steps", 100), total, tcfg.get("min_lr_ratio", 0.01)))
    scaler = torch.cuda.amp.GradScaler(enabled=use_amp)

    ignore = mcfg["ignore_index"] if mcfg["ignore_index"] is not None else 255
    cw = tcfg.get("class_weights")
    weight = torch.tensor(cw, dtype=torch.float32, device=device) if cw else None
    criterion = nn.CrossEntropyLoss(weight=weight, ignore_index=ignore)
    aux_w = tcfg.get("aux_weight", 0.4)
    aux_tap = tcfg.get("aux_tap", 2)

    start_epoch, best = 0, -1.0
    last_path = os.path.join(args.out, "last.pt")
    if args.resume:
        ck = torch.load(last_path, map_location="cpu")
        model.load_state_dict(ck["model"])
        aux.load_state_dict(ck["aux"])
        opt.load_state_dict(ck["optimizer"])
        sched.load_state_dict(ck["scheduler"])
        scaler.load_state_dict(ck["scaler"])
        start_epoch, best = ck["epoch"], ck.get("best_miou", -1.0)
        rng.setstate(ck["rng"]["python"])
        np.random.set_state(ck["rng"]["numpy"])
        torch.set_rng_state(ck["rng"]["torch"])
        if use_amp and ck["rng"].get("cuda") is not None:
            torch.cuda.set_rng_state_all(ck["rng"]["cuda"])
        print("resumed from %s at epoch %d (best mIoU %.2f)" % (last_path, start_epoch, best), flush=True)
    else:
        log_line(args.out, "# config %s: %s" % (args.config, json.dumps(tcfg)))

    for epoch in range(start_epoch, args.epochs):
        model.train()
        aux.train()
        t_ep = time.time()
        order = list(range(len(train_imgs)))
        rng.shuffle(order)
        sum_loss = sum_aux = 0.0
        for step in range(steps_per_epoch):
            batch = [augment(train_imgs[j], train_labels[j], tcfg, mcfg, rng)
                     for j in order[step * bs:(step + 1) * bs]]
            x = torch.stack([b[0] for b in batch]).to(device)
            y = torch.stack([b[1] for b in batch]).to(device)
            with torch.autocast(device_type="cuda", enabled=use_amp):
                stages = {}
                head = model(x, stages=stages)
                aux_logits = aux(stages["taps.%d" % aux_tap])
                head = F.interpolate(head.float(), size=y.shape[-2:], mode="bilinear", align_corners=False)
                aux_logits = F.interpolate(aux_logits.float(), size=y.shape[-2:], mode="bilinear",
                                           align_corners=False)
                loss_main = criterion(head, y)
                loss_aux = criterion(aux_logits, y)
                loss = loss_main + aux_w * loss_aux
            opt.zero_grad(set_to_none=True)
            scaler.scale(loss).backward()
            if tcfg.get("grad_clip"):
                scaler.unscale_(opt)
                torch.nn.utils.clip_grad_norm_(list(model.parameters()) + list(aux.parameters()),
                                               tcfg["grad_clip"])
            scaler.step(opt)
            scaler.update()
            sched.step()
            sum_loss += loss_main.item()
            sum_aux += loss_aux.item()
            if not math.isfinite(loss.item()):
                log_line(args.out, "non-finite loss at epoch %d step %d; stopping" % (epoch + 1, step))
                return 1
        secs = time.time() - t_ep
        n = max(1, steps_per_epoch)
        line = "epoch %d/%d loss %.4f aux %.4f lr %.3e time %.0fs" % (
            epoch + 1, args.epochs, sum_loss / n, sum_aux / n, opt.param_groups[0]["lr"], secs)
        done = epoch + 1
        miou = None
        if not args.no_val and (done % val_every == 0 or done == args.epochs):
            tv = time.time()
            miou, aacc, ious = evaluate(model, val_imgs, val_labels, mcfg, device,
                                        tcfg.get("val_batch", 4), use_amp)
            if miou > best:
                best = miou
                atomic_save({"model": model.state_dict(), "model_config": mcfg, "epoch": done,
                             "val_miou": miou, "val_aacc": aacc, "val_ious": ious,
                             "config_path": args.config},
                            os.path.join(args.out, "best.pt"))
            line += " val mIoU %.2f aAcc %.2f (best %.2f, val %.0fs) ious %s" % (
                miou, aacc, best, time.time() - tv, " ".join("%.1f" % v for v in ious))
        atomic_save({
            "model": model.state_dict(), "aux": aux.state_dict(), "optimizer": opt.state_dict(),
            "scheduler": sched.state_dict(), "scaler": scaler.state_dict(), "epoch": done,
            "best_miou": best, "model_config": mcfg, "train_config": tcfg, "config_path": args.config,
            "rng": {"python": rng.getstate(), "numpy": np.random.get_state(),
                    "torch": torch.get_rng_state(),
                    "cuda": torch.cuda.get_rng_state_all() if use_amp else None},
        }, last_path)
        log_line(args.out, line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
