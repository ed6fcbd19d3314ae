#!/usr/bin/python3
"""Masked image modelling (SimMIM) pretraining of the backbone on the
training frames, for a later `train.py --init-model`.

  /usr/bin/python3 tools/pretrain.py --config tools/configs/camvid-mita-xseq-crop240-skips-paste.json \
      --out /work/runs/mim --epochs 100 [--resume] [--time-budget S]
  /usr/bin/python3 tools/train.py --config ... --init-model /work/runs/mim/model.safetensors ...

No weights can be fetched here, so the backbone otherwise starts from random
init on a few hundred frames; this teaches it the frames' own structure
first, without their labels. The frames are the config's training split (a
holdout fold: only its training sequences, never the held-out one), with
the config's augmentation (scale, crop, flip, photometric, blur; no
copy-paste or CutMix). Per sample, `--mask-ratio` of the token grid in
`--mask-unit` x `--mask-unit` token squares is masked: those pixels are
zeroed at the input (the conv stem's receptive field spans neighbouring
patches; unmasked tokens would otherwise see them) and their tokens replaced
by a learned mask token before the position embedding. The last tap,
through LayerNorm and a 1x1 conv to patch^2 x 3 values and a pixel shuffle,
predicts the normalised pixels; the loss is L1 over the masked pixels only
(SimMIM). Attention is the config's (MiTA in every layer).

Every epoch writes OUT/last.pt atomically (--resume continues from it) and
appends a line to OUT/log.txt; the last epoch (or a time-budget stop) writes
OUT/model.safetensors: the config's whole model (F32), the backbone
pretrained, the neck and head at train.py's init; `train.py --init-model`
then fine-tunes it. --time-budget S stops after S seconds at a step
boundary, the cosine re-planned to end there.
"""

import argparse
import copy
import json
import math
import os
import random
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import mitaseg_ref as R  # noqa: E402
import train as T  # noqa: E402


class MimHead(nn.Module):
    """(B, C, Hp, Wp) tokens -> (B, 3, Hp * p, Wp * p) pixels: LayerNorm, 1x1
    conv to p * p * 3 values per token, pixel shuffle."""

    def __init__(self, dim, patch):
        super().__init__()
        self.patch = patch
        self.norm = nn.LayerNorm(dim)
        self.proj = nn.Conv2d(dim, patch * patch * 3, 1)

    def forward(self, t):
        t = self.norm(t.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)
        return F.pixel_shuffle(self.proj(t), self.patch)


class Mim(nn.Module):
    """The segmentation model's backbone with a mask token and MimHead."""

    def __init__(self, model):
        super().__init__()
        bb = model.cfg["backbone"]
        self.model = model
        self.patch = bb["patch_size"]
        self.mask_token = nn.Parameter(torch.zeros(1, 1, bb["embed_dim"]))
        nn.init.trunc_normal_(self.mask_token, std=0.02)
        self.head = MimHead(bb["embed_dim"], self.patch)
        self.att = R.resolve_attention(bb["attention"], None)

    def forward(self, x, mask):
        """x (B, 3, H, W) normalised; mask (B, H/p, W/p) bool, True = masked.
        Returns (prediction (B, 3, H, W), pixel mask (B, 1, H, W))."""
        p = self.patch
        pix = mask.repeat_interleave(p, 1).repeat_interleave(p, 2).unsqueeze(1)
        xin = x.masked_fill(pix, 0.0)
        m = mask.flatten(1).unsqueeze(-1)                              # (B, N, 1)

        def embed_fn(tok):                                             # (B, N, C)
            return torch.where(m, self.mask_token.to(tok.dtype), tok)
        taps = self.model.backbone(xin, self.att, embed_fn=embed_fn)
        return self.head(taps[-1]), pix


def random_masks(batch, grid, unit, ratio, rng):
    """(batch, gh, gw) bool: per sample, round(ratio x cells) of the unit x unit
    token squares covering the grid (the last ones cut by its edge), drawn
    from rng (random.Random)."""
    gh, gw = grid
    ch, cw = -(-gh // unit), -(-gw // unit)
    cells = ch * cw
    take = min(cells, max(1, int(round(ratio * cells))))
    out = torch.zeros(batch, ch, cw, dtype=torch.bool)
    for b in range(batch):
        for c in rng.sample(range(cells), take):
            out[b, c // cw, c % cw] = True
    out = out.repeat_interleave(unit, 1).repeat_interleave(unit, 2)
    return out[:, :gh, :gw].contiguous()


def mim_loss(pred, x, pix):
    """Mean L1 over the masked pixels' channels (float32)."""
    pix = pix.expand_as(x)
    return (pred.float() - x).abs().masked_select(pix).mean()


def write_model_file(mim, args, done, step, data_desc):
    """OUT/model.safetensors, atomically: the whole segmentation model (F32)
    with the pretrained backbone, for `train.py --init-model`."""
    tmp = os.path.join(args.out, "model.safetensors.tmp")
    model = copy.deepcopy(mim.model).cpu().to(memory_format=torch.contiguous_format)
    R.save_model(model, tmp, "F32", provenance="tools/pretrain.py (SimMIM, mask %.2f in %dx%d "
                 "token squares) %d epochs, %d steps on %s; neck and head untrained"
                 % (args.mask_ratio, args.mask_unit, args.mask_unit, done, step, data_desc))
    os.replace(tmp, os.path.join(args.out, "model.safetensors"))


def main(argv=None):
    t_start = time.time()
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", required=True, help="a train.py config (model, data, augmentation)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--epochs", type=int, default=100,
                    help="epochs of the schedule (with --time-budget: the most)")
    ap.add_argument("--resume", action="store_true", help="continue from OUT/last.pt")
    ap.add_argument("--mask-ratio", type=float, default=0.6)
    ap.add_argument("--mask-unit", type=int, default=2, help="masked squares' side, in tokens")
    ap.add_argument("--lr", type=float, default=5e-4)
    ap.add_argument("--weight-decay", type=float, default=0.05)
    ap.add_argument("--warmup-steps", type=int, default=200)
    ap.add_argument("--min-lr-ratio", type=float, default=0.01, help="the cosine's floor")
    ap.add_argument("--data-root", default=None)
    ap.add_argument("--holdout", default=None, help="as train.py's (default: the config's)")
    ap.add_argument("--time-budget", type=float, default=0)
    ap.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    ap.add_argument("--amp", default=None, choices=["auto", "bf16", "off"])
    ap.add_argument("--threads", type=int, default=None)
    args = ap.parse_args(argv)
    R.TRAIN_TOPK = True   # topk for the stable sort in training steps (mitaseg_ref)
    if not 0.0 < args.mask_ratio < 1.0 or args.mask_unit < 1:
        raise SystemExit("pretrain.py: --mask-ratio must be in (0, 1), --mask-unit >= 1")

    full_cfg = T.load_config(args.config)
    mcfg = R.complete_config(full_cfg["model"])
    tcfg = full_cfg["train"]
    patch = mcfg["backbone"]["patch_size"]
    ch, cw = tcfg["crop"]
    if ch % patch or cw % patch:
        raise SystemExit("pretrain.py: the crop %dx%d is not a multiple of the patch %d" % (ch, cw, patch))
    device, plan, seed, rng, root, holdout = T.run_setup(args, tcfg)
    train_pairs, _, data_desc = T.data_pairs(root, tcfg, holdout)
    imgs, labels = T.decode_all(train_pairs)   # labels only ride along (augment crops both)

    mim = Mim(T.new_model(mcfg))
    T.place([mim], device, plan)
    bs = tcfg["batch_size"]
    steps_per_epoch = len(imgs) // bs
    total = args.epochs * steps_per_epoch
    opt = torch.optim.AdamW(T.param_groups([mim], args.weight_decay), lr=args.lr, betas=(0.9, 0.95))
    sched_fn = T.WarmupCosine(args.warmup_steps, total, args.min_lr_ratio)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, sched_fn)
    start_epoch, step = 0, 0
    last_path = os.path.join(args.out, "last.pt")
    if args.resume:
        import convert
        ck = convert.load_checkpoint(last_path)
        mim.load_state_dict(ck["mim"])
        opt.load_state_dict(ck["optimizer"])
        sched.load_state_dict(ck["scheduler"])
        sched_fn = sched.lr_lambdas[0]
        sched_fn.total = total
        start_epoch, step = ck["epoch"], ck["step"]
        T.rng_restore(rng, ck["rng"], device)
        print("resumed from %s at epoch %d" % (last_path, start_epoch), flush=True)
    else:
        T.log_line(args.out, "# pretrain %s: %s" % (args.config, json.dumps(
            {k: v for k, v in vars(args).items() if k not in ("config", "out", "resume")})))
        T.log_line(args.out, "# data %s: %s" % (root, data_desc))

    budget = T.BudgetPlan(args.time_budget, t_start, total) if args.time_budget else None
    reserve = 5.0 + 0.02 * args.time_budget   # the checkpoint and the model file
    sampler = T.KeySampler()
    workers = T.loader_workers(tcfg, device)
    loader = torch.utils.data.DataLoader(T.TrainSet(imgs, labels, tcfg, mcfg), batch_size=bs,
                                         sampler=sampler, num_workers=workers, drop_last=True,
                                         pin_memory=device.type == "cuda",
                                         persistent_workers=workers > 0)
    stop = False
    for epoch in range(start_epoch, args.epochs):
        mim.train()
        t_ep = time.time()
        sampler.keys = T.epoch_keys(rng, len(imgs), steps_per_epoch, bs)
        sum_loss = torch.zeros((), device=device)
        n_steps = 0
        for x, _ in loader:
            mask = random_masks(x.shape[0], (ch // patch, cw // patch), args.mask_unit,
                                args.mask_ratio, random.Random(seed * 1000037 + step))
            x, mask = T.to_input(x, device, plan), mask.to(device)
            with T.autocast(device, plan):
                pred, pix = mim(x, mask)
            loss = mim_loss(pred, x.float(), pix)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
            step += 1
            n_steps += 1
            sum_loss += loss.detach()
            if budget is not None and budget.after_step(time.time(), step, t_ep, n_steps == steps_per_epoch,
                                                        lambda _: reserve, sched_fn):
                stop = True
                break
        mean = sum_loss.item() / max(1, n_steps)
        if not math.isfinite(mean):
            T.log_line(args.out, "non-finite loss in epoch %d; stopping (last.pt is the epoch before)"
                       % (epoch + 1))
            return 1
        done = epoch + 1
        T.atomic_save({"mim": mim.state_dict(), "optimizer": opt.state_dict(),
                       "scheduler": sched.state_dict(), "epoch": done, "step": step,
                       "model_config": mcfg, "train_config": tcfg, "config_path": args.config,
                       "data": data_desc,
                       "rng": T.rng_state(rng, device)}, last_path)
        if done == args.epochs or stop:   # last.pt resumes; the model file is for the end
            write_model_file(mim, args, done, step, data_desc)
        line = "epoch %d/%d loss %.4f lr %.3e time %.0fs" % (done, args.epochs, mean,
                                                              opt.param_groups[0]["lr"], time.time() - t_ep)
        if budget is not None:
            line += " step %d/%d (budget %.0fs, %.0fs used)" % (step, sched_fn.total, args.time_budget,
                                                               time.time() - t_start)
        T.log_line(args.out, line)
        if stop:
            T.log_line(args.out, "# time budget: stopped after %d steps, %.0fs" % (step, time.time() - t_start))
            break
    return 0


if __name__ == "__main__":
    sys.exit(main())
