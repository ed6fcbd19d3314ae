"""MiTA's k clamp with and without a class token, the engine against the
reference (mita-spec 2.2 and 2.7).

The spec clamps k "to N" and makes the class token "a key like any other";
what mitaseg does (README, "segment"): k is clamped to the number of keys,
the N grid tokens plus the class token when the model has one. So a request
of k = N + 1 routes every key with a class token (the class token, reported
as position N, is in every expert's set) and is clamped to N without one;
any larger k gives the same result. The engine (`mitaseg segment --dump
--topk K`, CPU) and the reference (tools/mitaseg_ref.py) must agree on the
effective k, the routed sets, the routes and the logits.
Needs the built engine (build/mitaseg, or MS_BUILD_DIR); skipped otherwise.
"""

import os
import subprocess
import tempfile
import unittest

import numpy as np
import torch

from tools.tests import REPO_DIR

import mitaseg_ref as R
import safetensors_io

BUILD = os.environ.get("MS_BUILD_DIR", os.path.join(REPO_DIR, "build"))
EXE = os.path.join(BUILD, "mitaseg")
FIX = os.path.join(REPO_DIR, "tests", "fixtures")


@unittest.skipUnless(os.path.exists(EXE), "engine not built (%s)" % EXE)
class TestTopkClamp(unittest.TestCase):
    def engine(self, model, img_path, k, d):
        dump = os.path.join(d, "k%d.safetensors" % k)
        p = subprocess.run([EXE, "segment", img_path, "-o", os.path.join(d, "out%d" % k),
                            "--model", model, "--device", "cpu", "--attention", "mita",
                            "--topk", str(k), "--dump", dump],
                           capture_output=True, text=True, timeout=300)
        self.assertEqual(p.returncode, 0, p.stderr)
        return safetensors_io.load(dump)

    def reference(self, model, img, k):
        st = {}
        with torch.no_grad():
            R.segment(model, img, attn={"type": "mita", "topk": k}, stages=st)
        return st

    def check(self, case, ncls):
        from PIL import Image
        path = os.path.join(FIX, case + ".model.safetensors")
        model = R.load_model(path, torch.float64)
        self.assertEqual(int(bool(model.cfg["backbone"].get("cls_token"))), ncls)
        g, _ = safetensors_io.load(os.path.join(FIX, case + ".golden.safetensors"))
        img = np.asarray(g["image"])
        depth = model.cfg["backbone"]["depth"]
        with tempfile.TemporaryDirectory() as d:
            img_path = os.path.join(d, "img.png")
            Image.fromarray(img).save(img_path)
            n = None
            results = {}
            for k in (10 ** 6, None):     # None: N + 1, once N is known
                k = k or n + 1
                t, meta = self.engine(path, img_path, k, d)
                st = self.reference(model, img, k)
                gh, gw, kk = st["layers.0.grid"]
                n = t["layers.0.route"].shape[-1] - ncls          # grid tokens N
                self.assertEqual(int(meta["topk"]), n + ncls, "engine's effective k, k=%d" % k)
                self.assertEqual(kk, n + ncls, "reference's effective k, k=%d" % k)
                for i in range(depth):
                    ti = t["layers.%d.topk_idx" % i]                 # (heads, M, k)
                    ri = st["layers.%d.topk_idx" % i][0].numpy()
                    self.assertEqual(ti.shape, ri.shape)
                    # every key in every set: the grid positions, and N (the class token)
                    want = np.arange(n + ncls)
                    self.assertTrue((np.sort(ti, -1) == want).all(), "engine layer %d" % i)
                    self.assertTrue((np.sort(ri, -1) == want).all(), "reference layer %d" % i)
                    np.testing.assert_array_equal(t["layers.%d.route" % i],
                                                  st["layers.%d.route" % i][0].numpy())
                lg, rl = t["logits"], st["logits"][0].numpy()
                rel = np.abs(lg - rl).max() / np.abs(rl).max()
                self.assertLess(rel, 1e-4, "logits, k=%d" % k)
                results[k] = lg
            a, b = results.values()
            np.testing.assert_array_equal(a, b)   # k = N + 1 and k = 10^6: one clamp

    def test_with_class_token(self):
        self.check("cls_mita", 1)

    def test_without_class_token(self):
        self.check("mita_d", 0)


if __name__ == "__main__":
    unittest.main()
