"""tools/export_onnx.py and bench/bench_cpu.py at a tiny size: the ONNX model
run by ONNX Runtime against the PyTorch reference and against mitaseg's
--dump, a wrong dump rejected, and one round of the benchmark driver with
every contender's output checked.

ONNX Runtime lives in build-bench-venv/ (tools/ort_venv.py makes it here on
first use, from the registry); where it cannot be made the tests are skipped
with the reason.
"""

import json
import os
import subprocess
import sys
import tempfile
import unittest
from unittest import mock

import numpy as np
import torch

from tools.tests import REPO_DIR, TOOLS_DIR
import mitaseg_ref as R
import ort_venv
import safetensors_io

TINY = os.path.join(REPO_DIR, "tests", "fixtures", "tiny.model.safetensors")
EXPORT = os.path.join(TOOLS_DIR, "export_onnx.py")
BUILD = os.path.join(REPO_DIR, "build")
W, H = 64, 48   # tiny's short_side 40: resize and padding are in the graph


class ExportSwitchTest(unittest.TestCase):
    """mitaseg_ref.EXPORT_ONNX's replacements against the exact ops (no ONNX
    Runtime needed)."""

    def tearDown(self):
        R.EXPORT_ONNX = False

    def test_pooling_matrices_equal_adaptive_pooling(self):
        x = torch.randn(2, 5, 13, 11, dtype=torch.float64)
        for size in [(7, 7), (3, 4), (13, 11), (1, 1), (26, 6)]:   # incl. more cells than rows
            want = torch.nn.functional.adaptive_avg_pool2d(x, size)
            R.EXPORT_ONNX = True
            got = R.adaptive_avg_pool(x, size)
            R.EXPORT_ONNX = False
            self.assertEqual(tuple(got.shape), tuple(want.shape))
            self.assertLess(float((got - want).abs().max()), 1e-12, size)
        self.assertIs(R.adaptive_avg_pool(x, (3, 4)).dtype, torch.float64)

    def test_switch_keeps_the_model(self):
        # Same routed sets and routes, logits to rounding, at the exact ops'
        # default again once the switch is off.
        model = R.load_model(TINY)
        img = np.random.default_rng(3).integers(0, 256, (H, W, 3), dtype=np.uint8)
        with torch.no_grad():
            exact, switched = {}, {}
            _, l0 = R.segment(model, img, stages=exact)
            R.EXPORT_ONNX = True
            _, l1 = R.segment(model, img, stages=switched)
            R.EXPORT_ONNX = False
            _, l2 = R.segment(model, img)
        self.assertLess(float((l1 - l0).abs().max() / l0.abs().max()), 1e-5)
        self.assertTrue(torch.equal(l2, l0))
        for i in range(model.cfg["backbone"]["depth"]):
            a, b = exact["layers.%d.topk_idx" % i], switched["layers.%d.topk_idx" % i]
            self.assertTrue(torch.equal(a.sort(-1).values, b.sort(-1).values), i)
            self.assertTrue(torch.equal(exact["layers.%d.route" % i],
                                        switched["layers.%d.route" % i]), i)


class ExportOnnxTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.python, why = ort_venv.ensure(timeout_s=300)
        if cls.python is None:
            raise unittest.SkipTest("no ONNX Runtime venv: %s" % why)
        cls.tmp = tempfile.TemporaryDirectory()
        cls.image = os.path.join(cls.tmp.name, "img.png")
        rgb = np.random.default_rng(7).integers(0, 256, (H, W, 3), dtype=np.uint8)
        from PIL import Image
        Image.fromarray(rgb).save(cls.image)
        cls.rgb = rgb

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def export(self, *extra):
        out = os.path.join(self.tmp.name, "m.onnx")
        r = subprocess.run([self.python, EXPORT, TINY, out, "--size", "%dx%d" % (W, H),
                            "--check", "--image", self.image, "--tol", "1e-4"] + list(extra),
                           capture_output=True, text=True, timeout=600)
        return r, out

    def errors(self, stdout):
        """{name: (relative error, mask %)} from --check's lines."""
        found = {}
        for line in stdout.splitlines():
            if line.startswith("ONNX Runtime vs "):
                name = line.split()[3].rstrip(":")
                err = float(line.split("relative error ")[1].split(",")[0])
                agree = float(line.split("masks ")[1].split()[0])
                found[name] = (err, agree)
        return found

    def test_mita_image_input_matches_reference(self):
        # A non-default grid and k: the override reaches the exported graph.
        r, out = self.export("--attention", "mita", "--input", "image",
                             "--landmarks", "2x3", "--topk", "5")
        self.assertEqual(r.returncode, 0, r.stderr)
        err, agree = self.errors(r.stdout)["reference"]
        self.assertLess(err, 1e-4)
        self.assertEqual(agree, 100.0)
        self.assertGreater(os.path.getsize(out), 10000)
        self.assertFalse(os.path.exists(out + ".tmp"))

    def test_full_tensor_input_matches_mitaseg_dump(self):
        exe = os.path.join(BUILD, "mitaseg")
        if not os.access(exe, os.X_OK):
            self.skipTest("build/mitaseg not built")
        dump = os.path.join(self.tmp.name, "full.safetensors")
        subprocess.run([exe, "segment", self.image, "--dump", dump, "--model", TINY,
                        "--device", "cpu", "--attention", "full"],
                       check=True, capture_output=True, timeout=300)
        r, _ = self.export("--attention", "full", "--dump", dump)
        self.assertEqual(r.returncode, 0, r.stderr)
        found = self.errors(r.stdout)
        self.assertLess(found["reference"][0], 1e-4)
        self.assertLess(found["mitaseg"][0], 1e-4)
        self.assertEqual(found["mitaseg"][1], 100.0)

    def test_wrong_dump_is_rejected(self):
        # The reference's own logits, off by 1 % of their largest value at one
        # pixel: --check must see it (relative error 1e-2 > --tol 1e-4).
        model = R.load_model(TINY)
        with torch.no_grad():
            mask, logits = R.segment(model, self.rgb)
        logits = logits.numpy().copy()
        logits[0, 5, 7] += 0.01 * np.abs(logits).max()
        dump = os.path.join(self.tmp.name, "wrong.safetensors")
        safetensors_io.save(dump, {"logits": logits[None], "mask": mask.numpy()[None]})
        r, _ = self.export("--dump", dump)
        self.assertEqual(r.returncode, 1, r.stdout + r.stderr)
        err, _ = self.errors(r.stdout)["mitaseg"]
        self.assertAlmostEqual(err, 1e-2, delta=2e-3)
        self.assertIn("above --tol", r.stderr)

    def test_bench_driver_one_round(self):
        if not os.access(os.path.join(BUILD, "bench_engine"), os.X_OK):
            self.skipTest("build/bench_engine not built")
        out = os.path.join(self.tmp.name, "bench.json")
        r = subprocess.run(["/usr/bin/python3", os.path.join(REPO_DIR, "bench", "bench_cpu.py"),
                            "--build", BUILD, "--model", TINY, "--size", "%dx%d" % (W, H),
                            "--rounds", "1", "--threads", "1", "--gap", "0", "--json", out,
                            "--openblas-env", "keep"],   # tests leave OpenBLAS's variables alone
                           capture_output=True, text=True, timeout=600)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        with open(out) as f:
            report = json.load(f)
        self.assertEqual(report["skipped"], [])
        (case,) = report["cases"]
        self.assertEqual([label for label, _ in case["results"]], ["MiTA 3x3, k 8", "full"])
        for _, rows in case["results"]:
            names = [row["contender"] for row in rows]
            self.assertEqual(names[0], "mitaseg")
            self.assertTrue(names[1].startswith("PyTorch "), names)
            self.assertTrue(names[2].startswith("ONNX Runtime "), names)
            for row in rows:
                self.assertEqual(len(row["times_ms"]), 1)
                self.assertGreater(row["min_ms"], 0)
                self.assertGreater(row["peak_rss_mb"], 1)
                self.assertLess(row["rel_error"], 1e-4)
                self.assertEqual(row["mask_equal_pct"], 100.0)
        self.assertIn("| full | mitaseg |", r.stdout)
        # the header names the CPU kernels the engine ran (kernels/cpu_path.h)
        self.assertRegex(r.stdout, r"Versions: mitaseg \S+ \((CUDA-enabled|CPU-only) build, "
                                   r"(base|v3|v4) CPU kernels; OpenBLAS [^;]*; GEMMs by "
                                   r"(onednn|openblas)\)")
        self.assertIn(report["openblas_env"], r.stdout)
        self.assertRegex(report["openblas_env"], r"^OpenBLAS: (no OPENBLAS_CORETYPE|.* kept)")

    def test_bench_gemm_both(self):
        """--gemm-both: the engine on its GEMM library and with MS_GEMM=openblas
        in the same rounds, the same results; refused where it runs OpenBLAS
        already (no AVX-512 or no libdnnl: kernels/gemm.h)."""
        if not os.access(os.path.join(BUILD, "bench_engine"), os.X_OK):
            self.skipTest("build/bench_engine not built")
        doctor = subprocess.run([os.path.join(BUILD, "mitaseg"), "doctor", "--no-selftest"],
                                capture_output=True, text=True, timeout=60).stdout
        out = os.path.join(self.tmp.name, "bench.json")
        r = subprocess.run(["/usr/bin/python3", os.path.join(REPO_DIR, "bench", "bench_cpu.py"),
                            "--build", BUILD, "--model", TINY, "--size", "%dx%d" % (W, H),
                            "--rounds", "1", "--threads", "1", "--gap", "0", "--json", out,
                            "--attention", "full", "--no-ort", "--gemm-both",
                            "--openblas-env", "keep"], capture_output=True, text=True, timeout=600)
        if "\ngemm: onednn" not in "\n" + doctor:
            self.assertNotEqual(r.returncode, 0)
            self.assertIn("--gemm-both: the engine runs OpenBLAS already", r.stderr)
            return
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        with open(out) as f:
            (case,) = json.load(f)["cases"]
        ((_, rows),) = case["results"]
        self.assertEqual([row["contender"] for row in rows[:2]],
                         ["mitaseg", "mitaseg, MS_GEMM=openblas"])
        self.assertEqual(rows[0]["info"]["gemm"], "onednn")
        self.assertEqual(rows[1]["info"]["gemm"], "openblas")
        self.assertLess(rows[1]["rel_error"], 1e-5)
        self.assertEqual(rows[1]["mask_equal_pct"], 100.0)
        self.assertIn("GEMMs by onednn", r.stdout)

    def test_bench_openblas_env(self):
        """--openblas-env native unsets both variables for the workers, keep
        leaves them; the report line says which (os.environ restored after)."""
        sys.path.insert(0, os.path.join(REPO_DIR, "bench"))
        import bench_cpu
        env = {"OPENBLAS_CORETYPE": "Haswell", "OPENBLAS_L2_SIZE": "512", "OTHER": "1"}
        with mock.patch.dict(os.environ, env, clear=True):
            line = bench_cpu.openblas_env("keep")
            self.assertEqual(dict(os.environ), env)
            self.assertIn("OPENBLAS_CORETYPE=Haswell OPENBLAS_L2_SIZE=512 kept", line)
            line = bench_cpu.openblas_env("native")
            self.assertEqual(dict(os.environ), {"OTHER": "1"})
            self.assertIn("OPENBLAS_CORETYPE=Haswell OPENBLAS_L2_SIZE=512 unset", line)
            self.assertIn("no OPENBLAS_CORETYPE", bench_cpu.openblas_env("native"))


if __name__ == "__main__":
    unittest.main()
