"""tools/pretrain.py (SimMIM pretraining of the backbone): the masks, the
promise that masked pixels cannot leak into the prediction, and a tiny run
through the CLI: the loss goes down, --resume continues exactly, and the
model file it writes is what train.py --init-model starts from."""

import copy
import json
import os
import random
import re
import tempfile
import unittest

import torch

from tools.tests import TOOLS_DIR  # noqa: F401  (puts tools/ on sys.path)
import convert
from tools.tests.test_train import MODEL, TRAIN, make_dataset, run_tool
import mitaseg_ref as R
import pretrain as P
import train as T


def conv_model():
    m = copy.deepcopy(MODEL)
    m["backbone"]["stem"] = {"type": "conv", "channels": [4, 8, 8, 16]}
    return m


def losses(log_path):
    with open(log_path) as f:
        return [float(m.group(1)) for m in (re.match(r"epoch \d+/\d+ loss ([\d.]+)", l) for l in f) if m]


class TestMasks(unittest.TestCase):
    def test_ratio_units_and_seed(self):
        m = P.random_masks(3, (15, 20), 2, 0.6, random.Random(5))
        self.assertEqual(tuple(m.shape), (3, 15, 20))
        cells = m[:, ::2, ::2]                       # one entry per 2x2 square (8 x 10)
        self.assertEqual(cells.flatten(1).sum(1).tolist(), [48, 48, 48])   # round(0.6 * 80)
        # whole squares: every token equals its square's corner
        up = cells.repeat_interleave(2, 1).repeat_interleave(2, 2)[:, :15, :20]
        self.assertTrue(torch.equal(m, up))
        self.assertTrue(torch.equal(m, P.random_masks(3, (15, 20), 2, 0.6, random.Random(5))))
        self.assertFalse(torch.equal(m, P.random_masks(3, (15, 20), 2, 0.6, random.Random(6))))
        self.assertFalse(torch.equal(m[0], m[1]))   # per sample


class TestNoLeak(unittest.TestCase):
    def test_masked_pixels_do_not_reach_the_prediction(self):
        # the conv stem's 3x3 convs reach across patch borders: without the
        # input zeroed, changing masked pixels would change unmasked tokens
        torch.manual_seed(0)
        for cfg in (MODEL, conv_model()):
            mim = P.Mim(T.new_model(R.complete_config(cfg))).eval()
            x = torch.randn(2, 3, 64, 96)
            mask = P.random_masks(2, (4, 6), 1, 0.5, random.Random(1))
            pix = mask.repeat_interleave(16, 1).repeat_interleave(16, 2).unsqueeze(1)
            y = torch.where(pix, torch.randn_like(x) * 5, x)
            with torch.no_grad():
                a, _ = mim(x, mask)
                b, _ = mim(y, mask)
            self.assertTrue(torch.equal(a, b))
            # and unmasked pixels do reach it
            z = torch.where(pix, x, x + 1.0)
            with torch.no_grad():
                c, _ = mim(z, mask)
            self.assertFalse(torch.equal(a, c))


class TestPretrainCli(unittest.TestCase):
    def test_run_resume_and_init_model(self):
        with tempfile.TemporaryDirectory() as root:
            make_dataset(os.path.join(root, "data"))
            config = os.path.join(root, "tiny.json")
            with open(config, "w") as f:
                json.dump({"model": conv_model(), "train": dict(TRAIN, data_root=os.path.join(root, "data"))}, f)
            common = ["--config", config, "--warmup-steps", 0, "--min-lr-ratio", 1.0, "--lr", 3e-3]
            a, b = os.path.join(root, "a"), os.path.join(root, "b")
            run_tool("pretrain.py", *common, "--out", a, "--epochs", 6)
            loss = losses(os.path.join(a, "log.txt"))
            self.assertEqual(len(loss), 6)
            self.assertLess(loss[-1], 0.8 * loss[0], loss)
            run_tool("pretrain.py", *common, "--out", b, "--epochs", 2)
            run_tool("pretrain.py", *common, "--out", b, "--epochs", 6, "--resume")
            ka = convert.load_checkpoint(os.path.join(a, "last.pt"))["mim"]
            kb = convert.load_checkpoint(os.path.join(b, "last.pt"))["mim"]
            for k in ka:
                self.assertTrue(torch.equal(ka[k], kb[k]), k)
            # the model file holds the pretrained backbone
            model = R.load_model(os.path.join(a, "model.safetensors"))
            for k, v in R.model_tensors(model).items():
                self.assertTrue(torch.equal(v, ka["model." + k].float()), k)
            # train.py starts from it (lr 0: the first checkpoint keeps its weights)
            tcfg = os.path.join(root, "ft.json")
            with open(tcfg, "w") as f:
                json.dump({"model": conv_model(),
                           "train": dict(TRAIN, lr=0.0, data_root=os.path.join(root, "data"))}, f)
            run_tool("train.py", "--config", tcfg, "--out", os.path.join(root, "ft"), "--epochs", 1,
                     "--no-val", "--init-model", os.path.join(a, "model.safetensors"))
            got = convert.load_checkpoint(os.path.join(root, "ft", "last.pt"))["model"]
            for k, v in R.model_tensors(model).items():
                if not k.endswith(("running_mean", "running_var")):
                    self.assertTrue(torch.equal(got[k], v), k)


if __name__ == "__main__":
    unittest.main()
