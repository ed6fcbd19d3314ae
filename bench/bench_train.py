#!/usr/bin/python3
"""One training step of tools/train.py's model, side by side: with the two
training shortcuts of tools/mitaseg_ref.py (bf16 bilinear resizes in fp32
channels-last on the CPU; torch.topk for MiTA's routed sets where gradients
are on) and without them (the exact ops the goldens use), interleaved in
blocks of steps in one process, same model, batch and optimiser.

  /usr/bin/python3 bench/bench_train.py [--config tools/configs/...json]
      [--threads 2] [--rounds 6] [--steps 2] [--amp bf16|off] [--batch N]
      [--device cpu|cuda] [--json OUT]

A step: train.py's forward_losses (forward under the run's autocast, the
main and auxiliary losses at the crop size; plain cross entropy here),
backward, AdamW. Random input of the config's
crop size and batch. Prints min and median seconds a step for each and the
ratio exact / shortcuts (> 1: the shortcuts are faster).
"""
import argparse
import json
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "tools"))
import mitaseg_ref as R  # noqa: E402
import train as T  # noqa: E402


def plain_bilinear(x, **size_or_scale):
    return F.interpolate(x, mode="bilinear", align_corners=False, **size_or_scale)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default=os.path.join(REPO, "tools", "configs",
                                                     "camvid-mita-xseq-crop240-skips-paste.json"))
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--steps", type=int, default=2, help="steps of each contender per round")
    ap.add_argument("--amp", default="bf16", choices=["bf16", "off"])
    ap.add_argument("--batch", type=int, default=None, help="default: the config's batch_size")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    cfg = T.load_config(args.config)
    mcfg, tcfg = R.complete_config(cfg["model"]), cfg["train"]
    device = torch.device(args.device)
    plan = T.precision_plan(device, tcfg, args.amp)
    model = T.new_model(mcfg)
    aux = T.AuxHead(mcfg["backbone"]["embed_dim"], tcfg.get("aux_channels", 64), len(mcfg["classes"]))
    T.place([model, aux], device, plan)
    opt = torch.optim.AdamW(list(model.parameters()) + list(aux.parameters()), lr=1e-4)
    bs = args.batch or tcfg["batch_size"]
    ch, cw = tcfg["crop"]
    x = T.to_input(torch.rand(bs, 3, ch, cw), device, plan)
    y = torch.randint(0, len(mcfg["classes"]), (bs, ch, cw), device=device)
    criterion = T.SegLoss(None, 255, None, 0.0).to(device)   # plain cross entropy
    aux_tap, aux_w = tcfg.get("aux_tap", 2), tcfg.get("aux_weight", 0.4)

    def step():
        loss_main, loss_aux = T.forward_losses(model, aux, aux_tap, criterion, x, y, device, plan)
        loss = loss_main + aux_w * loss_aux
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if device.type == "cuda":
            torch.cuda.synchronize()

    fast_bilinear = R.bilinear
    modes = {"exact": (False, plain_bilinear), "shortcuts": (True, fast_bilinear)}
    times = {k: [] for k in modes}
    saved = R.TRAIN_TOPK
    try:
        for name, (topk, bil) in modes.items():     # warm-up, each
            R.TRAIN_TOPK, R.bilinear = topk, bil
            step()
        for _ in range(args.rounds):
            for name, (topk, bil) in modes.items():
                R.TRAIN_TOPK, R.bilinear = topk, bil
                for _ in range(args.steps):
                    t = time.perf_counter()
                    step()
                    times[name].append(time.perf_counter() - t)
    finally:
        R.TRAIN_TOPK, R.bilinear = saved, fast_bilinear

    mins = {k: min(v) for k, v in times.items()}
    meds = {k: statistics.median(v) for k, v in times.items()}
    print("training step, %s, batch %d of %dx%d, amp %s, %d threads, %d steps each (load %.2f)"
          % (os.path.basename(args.config), bs, ch, cw, args.amp, args.threads,
             len(times["exact"]), os.getloadavg()[0]))
    print("| contender | s a step min / median | exact / this, min / median |")
    print("|---|---|---|")
    for k in modes:
        print("| %s | %.3f / %.3f | %.2fx / %.2fx |" % (k, mins[k], meds[k], mins["exact"] / mins[k],
                                                      meds["exact"] / meds[k]))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"config": args.config, "batch": bs, "crop": [ch, cw], "amp": args.amp,
                       "threads": args.threads, "seconds": times}, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
