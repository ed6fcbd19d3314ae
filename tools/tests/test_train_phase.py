"""The GPU run's training phase (tests/gpu/train-phase.sh) rehearsed on the
CPU at a tiny size: a synthetic CamVid-like set packed by tools/pack_data.py,
a leave-one-sequence-out fold, a 12-second budget with bf16 autocast (the
CUDA path's precision, on the CPU). The phase must stop on time, plan its
cosine to end there, and leave last.pt and an F16 model file."""

import json
import os
import re
import subprocess
import tempfile
import time
import unittest

import numpy as np
import torch
from PIL import Image

from tools.tests import REPO_DIR
from tools.tests.test_train import MODEL, TRAIN
import convert
import mitaseg_ref as R
import pack_data
import safetensors_io

BUDGET = 12


def make_sequences(root):
    """Frames of three 'sequences' (A, B in train.txt; C in val.txt), named
    like CamVid's (SEQ_frame.png), with red/blue rectangles labelled 1/2."""
    rng = np.random.default_rng(0)
    for d in ("train", "trainannot", "val", "valannot"):
        os.makedirs(os.path.join(root, d))
    for split, seqs in (("train", "AB"), ("val", "C")):
        lines = []
        for seq in seqs:
            for i in range(3):
                img = rng.integers(40, 120, (64, 96, 3)).astype(np.uint8)
                lab = np.zeros((64, 96), np.uint8)
                for cls, colour in ((1, (220, 30, 30)), (2, (30, 30, 220))):
                    y, x = rng.integers(0, 34), rng.integers(0, 56)
                    img[y:y + 30, x:x + 40] = colour
                    lab[y:y + 30, x:x + 40] = cls
                name = "%s_%02d.png" % (seq, i)
                Image.fromarray(img).save(os.path.join(root, split, name))
                Image.fromarray(lab).save(os.path.join(root, split + "annot", name))
                lines.append("%s/%s %sannot/%s" % (split, name, split, name))
        with open(os.path.join(root, split + ".txt"), "w") as f:
            f.write("\n".join(lines) + "\n")


class TestPackData(unittest.TestCase):
    def test_pack(self):
        with tempfile.TemporaryDirectory() as root:
            make_sequences(os.path.join(root, "data"))
            out = os.path.join(root, "pack")
            n, total = pack_data.pack(os.path.join(root, "data"), out)
            self.assertEqual(n, 9)
            self.assertFalse(os.path.exists(out + ".tmp"))
            for lst in ("train.txt", "val.txt"):
                src = pack_data.make_splits.read_list(os.path.join(root, "data", lst))
                got = pack_data.make_splits.read_list(os.path.join(out, lst))
                self.assertEqual(len(got), len(src))
                for (si, sl), (gi, gl) in zip(src, got):
                    self.assertTrue(gi.endswith(".jpg"))
                    self.assertEqual(os.path.basename(gi)[:-4], os.path.basename(si)[:-4])  # sequence kept
                    a = np.asarray(Image.open(si), np.float64)
                    b = np.asarray(Image.open(gi), np.float64)
                    self.assertEqual(a.shape, b.shape)
                    # per-pixel noise is JPEG's worst case (chroma subsampling): loose bound
                    self.assertLess(np.abs(a - b).mean(), 20.0)
                    with open(sl, "rb") as f1, open(gl, "rb") as f2:
                        self.assertEqual(f1.read(), f2.read())          # labels byte for byte
            with self.assertRaises(FileExistsError):
                pack_data.pack(os.path.join(root, "data"), out)
            self.assertEqual(pack_data.main([os.path.join(root, "nope"), os.path.join(root, "p2")]), 1)
            self.assertFalse(os.path.exists(os.path.join(root, "p2")))


class TestTrainPhaseRehearsal(unittest.TestCase):
    def test_rehearsal(self):
        with tempfile.TemporaryDirectory() as root:
            make_sequences(os.path.join(root, "data"))
            pack = os.path.join(root, "pack")
            pack_data.pack(os.path.join(root, "data"), pack)
            config = os.path.join(root, "tiny.json")
            train = dict(TRAIN, data_root="/nonexistent", min_lr_ratio=0.01, warmup_steps=2,
                         scale_range=[0.5, 2.0], photometric={"gamma": 0.2, "hue": 0.05},
                         blur={"prob": 0.3, "sigma": [0.5, 1.0]}, ema=0.99,
                         class_weighting={"type": "sqrt_inv_freq", "clip": [0.5, 3.0]},
                         workers=2)   # the CUDA path's persistent DataLoader workers
            with open(config, "w") as f:
                json.dump({"model": MODEL, "train": train}, f)
            out = os.path.join(root, "out")
            env = dict(os.environ, MS_TRAIN_CONFIG=config, MS_TRAIN_DATA=pack, MS_TRAIN_HOLDOUT="B",
                       MS_TRAIN_ARGS="--amp bf16 --val-every 1000")
            t0 = time.time()
            p = subprocess.run(["bash", os.path.join(REPO_DIR, "tests", "gpu", "train-phase.sh"), out,
                                str(BUDGET)], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True, timeout=300)
            wall = time.time() - t0
            self.assertEqual(p.returncode, 0, p.stdout[-3000:])
            # on time: the budget plus slack for a loaded machine (interpreter start-up)
            self.assertLess(wall, BUDGET + 20, p.stdout)
            with open(os.path.join(out, "train.out")) as f:
                log = f.read()
            self.assertIn("holdout B", log)
            self.assertIn("amp torch.bfloat16", log)
            self.assertIn("validated on B (3 frames", log)
            self.assertRegex(log, r"# time budget: stopped after \d+ steps")
            ck = convert.load_checkpoint(os.path.join(out, "last.pt"))
            self.assertGreater(ck["step"], 10)
            self.assertIsNotNone(ck["ema"])
            # the cosine was planned to end at the budget: the last lr is far below the peak
            lr_end = float(re.findall(r"lr ([\d.e+-]+)", log)[-1])
            self.assertLess(lr_end, 0.5 * train["lr"], log[-2000:])
            # the export: F16 weights, the EMA ones, the fold named in the provenance
            tensors, meta = safetensors_io.load(os.path.join(out, "model.safetensors"))
            model = R.load_model(os.path.join(out, "model.safetensors"))
            self.assertIn("minus sequence B", model.cfg["provenance"])
            self.assertIn("weight EMA", model.cfg["provenance"])
            ema = ck["ema"]["backbone.blocks.0.attn.qkv.weight"]
            got = model.state_dict()["backbone.blocks.0.attn.qkv.weight"]
            self.assertTrue(torch.equal(got, ema.half().float()))
            with open(os.path.join(out, "model.safetensors"), "rb") as f:
                hlen = int.from_bytes(f.read(8), "little")
                header = json.loads(f.read(hlen))
            self.assertEqual({v["dtype"] for k, v in header.items() if k != "__metadata__"}, {"F16"})

    def test_bad_arguments(self):
        script = os.path.join(REPO_DIR, "tests", "gpu", "train-phase.sh")
        for args in ([], ["/tmp/x"], ["/tmp/x", "ten"], ["/tmp/x", "60", "imagenet"]):
            p = subprocess.run(["bash", script] + args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True, timeout=60)
            self.assertEqual(p.returncode, 2, (args, p.stdout))


if __name__ == "__main__":
    unittest.main()
