"""The converters, the reference and the engine against the real upstream
libraries: mmsegmentation 1.2.2 (mmcv-lite 2.1.0, mmengine) and timm
(tools/tests/requirements-upstream.txt).

Models are built by the libraries from their own shipped configs (mmseg's
configs/vit/*.py, timm's model registry), made small where a config allows
it (4 blocks, a small test image), given random weights with non-trivial
BatchNorm statistics, and run in float64. Each is saved as the library saves
a checkpoint (mmseg 0.x: meta.config and a projection bias; 1.x: meta.cfg,
patch_bias=False), converted by tools/convert.py with no flag beyond
--attention full, and compared stage by stage on a PNG file that mmseg
reads and runs through its own inference API (mmseg.apis.inference_model:
LoadImageFromFile, its OpenCV uint8 Resize keep_ratio, PackSegInputs, the
data preprocessor, test_step):
  - the reference (tools/mitaseg_ref.py, float64) against mmseg's own stages
    (forward hooks), and its whole pipeline against mmseg's result;
  - the engine (float32), through tests/test_golden (MS_GOLDEN_EXTRA) on a
    golden file holding mmseg's stages and the image.
TestOpenCVResize checks the engine's and the reference's uint8 resize
(input.resize cv2_uint8) byte for byte against cv2.resize on a sweep of sizes.
Run under the virtualenv tools/tests/setup_upstream_venv.sh makes
(tests/run.sh does); skipped where the libraries are not importable.
MS_UPSTREAM_REPORT=FILE appends the measured agreement there (README, Models).
"""

import json
import math
import os
import subprocess
import sys
import tempfile
import unittest

import numpy as np
import torch
import torch.nn.functional as F

from tools.tests import TOOLS_DIR  # noqa: F401  (puts tools/ on sys.path)

try:
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import upstream_env  # noqa: F401
    import timm
    import timm.layers
    import mmseg
    from mmengine import Config
    from mmseg.apis import inference_model
    from mmseg.registry import MODELS
    from mmseg.structures import SegDataSample
    from mmseg.utils import register_all_modules
    register_all_modules()
    WHY_NOT = None
except Exception as e:  # the libraries are optional: see setup_upstream_venv.sh
    WHY_NOT = "%s: %s" % (type(e).__name__, e)

import convert
import mitaseg_ref as R
import safetensors_io

REPO = os.path.dirname(TOOLS_DIR)
ENGINE_TEST = os.path.join(os.environ.get("MS_BUILD_DIR", os.path.join(REPO, "build")),
                           "test_golden")
K = 7                  # classes
IMG = (70, 100)        # test image; configs' Resize scale set to (2048, 72): 72x103
SHORT = 72


def report(line):
    path = os.environ.get("MS_UPSTREAM_REPORT")
    if path:
        with open(path, "a") as f:
            f.write(line + "\n")
    print(line)


def randomise(model, seed):
    """Random weights keeping activations O(1); BN statistics non-trivial."""
    g = torch.Generator().manual_seed(seed)
    rn = lambda t: torch.randn(t.shape, generator=g, dtype=torch.float64)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(("cls_token", "pos_embed")):
                p.copy_(0.5 * rn(p))
            elif p.dim() == 1 and ("ln" in name or "norm" in name or ".bn." in name) \
                    and name.endswith("weight"):
                p.copy_(1 + 0.2 * rn(p))
            elif p.dim() == 1:
                p.copy_(0.1 * rn(p))
            else:
                fan_in = p[0].numel()
                gain = 1.5 if "in_proj" in name or "qkv" in name else 1.0
                p.copy_(rn(p) * gain / math.sqrt(fan_in))
        for m in model.modules():
            if isinstance(m, torch.nn.modules.batchnorm._BatchNorm):
                m.running_mean.copy_(0.2 * rn(m.running_mean))
                m.running_var.copy_(0.5 + 1.5 * torch.rand(m.running_var.shape, generator=g,
                                                            dtype=torch.float64))


def make_image(seed):
    g = np.random.default_rng(seed)
    H, W = IMG
    yy, xx = np.mgrid[0:H, 0:W].astype(np.float64)
    img = np.stack([128 + 90 * np.sin(0.07 * yy + 0.05 * xx + c) for c in range(3)], -1)
    img += g.normal(0, 20, img.shape)
    return np.clip(np.round(img), 0, 255).astype(np.uint8)


@unittest.skipIf(WHY_NOT is not None, "upstream libraries not importable (%s)" % WHY_NOT)
class TestMmseg(unittest.TestCase):
    CFG_DIR = None

    @classmethod
    def setUpClass(cls):
        cls.CFG_DIR = os.path.join(os.path.dirname(mmseg.__file__), ".mim", "configs")
        cls.tmp = tempfile.TemporaryDirectory()
        cls.cases = []      # (path prefix, description) for the engine run

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    # ------------------------------------------------------------ building

    def build(self, config, layout="1.x", backbone=None, test_cfg=None, size_divisor=None):
        """mmseg model from its shipped config, 4 blocks, BN (not SyncBN) for
        the CPU, random float64 weights. Returns (checkpoint dict, model)."""
        cfg = Config.fromfile(os.path.join(self.CFG_DIR, config))
        m = cfg.model
        m.pretrained = None
        m.backbone.update(num_layers=4, out_indices=(0, 1, 2, 3), drop_path_rate=0.0,
                          img_size=(64, 80))          # position grid 4x5, run grid 5x7
        if layout == "0.x":
            m.backbone.patch_bias = True             # mmseg 0.x's PatchEmbed had a bias
        m.backbone.update(backbone or {})
        # UPerHead width 64 instead of 512: the same layers, 60x fewer FLOPs
        m.decode_head.update(num_classes=K, channels=64, norm_cfg=dict(type="BN", requires_grad=True))
        if m.get("auxiliary_head"):
            m.auxiliary_head.update(num_classes=K, norm_cfg=dict(type="BN", requires_grad=True))
        if test_cfg:
            m.test_cfg = test_cfg
        if size_divisor:    # the data preprocessor pads at test time (mmseg crops after)
            m.data_preprocessor.test_cfg = dict(size_divisor=size_divisor)
        for p in cfg.test_pipeline:
            if p["type"] == "Resize":
                p["scale"] = (2048, SHORT)
        cfg.test_dataloader.dataset.pipeline = cfg.test_pipeline
        model = MODELS.build(m).double().eval()   # every weight is set below
        randomise(model, 1234)
        sd = {k: v.float() if v.is_floating_point() else v for k, v in model.state_dict().items()}
        # checkpoints as the two mmseg generations save them
        if layout == "0.x":
            meta = {"mmseg_version": "0.30.0", "config": cfg.pretty_text,
                    "CLASSES": ["c%d" % i for i in range(K)]}
        else:
            meta = {"mmseg_version": "1.2.2", "cfg": cfg.pretty_text,
                    "dataset_meta": {"classes": ["c%d" % i for i in range(K)]}}
        model.float()
        model.load_state_dict(sd)       # the float32 weights the checkpoint holds
        model.cfg = cfg                 # what mmseg.apis.init_model sets: inference_model reads it
        return {"meta": meta, "state_dict": sd}, model.double().eval()

    def convert(self, ck, name, *flags):
        src = os.path.join(self.tmp.name, name + ".pth")
        dst = os.path.join(self.tmp.name, name + ".model.safetensors")
        torch.save(ck, src)
        rc = convert.main(["mmseg", src, dst, "--attention", "full"] + list(flags))
        self.assertEqual(rc, 0)
        return dst

    # ------------------------------------------------------------ mmseg's stages

    def mmseg_stages(self, model, img_path, cls_token):
        """mmseg's own stages from its own inference on an image file
        (mmseg.apis.inference_model: its test pipeline, OpenCV uint8 resize
        included, its data preprocessor, padding and test mode)."""
        st, hooks = {}, []
        bb = model.backbone
        hook = lambda name, f=lambda o: o: (lambda mod, i, o: st.__setitem__(name, f(o)))
        # the backbone's input: normalised, padded only where the preprocessor pads
        hooks.append(bb.register_forward_pre_hook(lambda mod, args: st.__setitem__("x", args[0])))
        hooks.append(bb.drop_after_pos.register_forward_hook(
            hook("embed", (lambda o: o) if cls_token else (lambda o: o[:, 1:]))))
        for i, layer in enumerate(bb.layers):
            hooks.append(layer.register_forward_hook(hook("blocks.%d" % i, lambda o: o.clone())))
        hooks.append(bb.register_forward_hook(hook("taps", lambda o: list(o))))
        if model.with_neck:
            hooks.append(model.neck.register_forward_hook(hook("neck", lambda o: list(o))))
        dh = model.decode_head
        hooks.append(dh.bottleneck.register_forward_hook(hook("head.psp")))
        for l in range(3):
            hooks.append(dh.fpn_convs[l].register_forward_hook(hook("head.fpn.%d" % l)))
        hooks.append(dh.fpn_bottleneck.register_forward_hook(hook("head.fused")))
        hooks.append(dh.conv_seg.register_forward_hook(hook("head.logits")))
        with torch.no_grad():
            out = inference_model(model, img_path)
        for h in hooks:
            h.remove()
        self.assertEqual(st["x"].dtype, torch.float64)
        for j in range(4):
            st["taps.%d" % j] = st["taps"][j]
            if model.with_neck:
                st["neck.%d" % j] = st["neck"][j]
            else:
                st["neck.%d" % j] = st["taps"][j]
        st.pop("taps")
        st.pop("neck", None)
        x = st.pop("x")                      # (1, 3, h, w); a slide run: its last window
        rh, rw = x.shape[-2:]
        padded = F.pad(x, (0, -(-rw // 16) * 16 - rw, 0, -(-rh // 16) * 16 - rh))
        hp, wp = padded.shape[-2] // 16, padded.shape[-1] // 16
        pos = type(bb).resize_pos_embed(bb.pos_embed, (hp, wp), (4, 5), bb.interpolate_mode)
        st["pos_embed"] = pos if cls_token else pos[:, 1:]
        st["input"] = padded
        st["logits"] = out.seg_logits.data.unsqueeze(0)
        st["mask"] = out.pred_sem_seg.data.to(torch.uint8)
        self.assertEqual(tuple(st["mask"].shape), (1,) + IMG)
        return st

    # ------------------------------------------------------------ the checks

    def compare(self, name, desc, model_path, st, img, img_path, slide=False):
        """Reference vs mmseg (float64, in Python), then the engine vs mmseg
        (float32, tests/test_golden on a golden of mmseg's stages)."""
        ref = R.load_model(model_path, torch.float64)
        # mmseg's data preprocessor makes its mean/std float32 tensors (then
        # .double()): the reference gets the same float32-rounded constants
        # (the engine's are float32 anyway)
        for key in ("mean", "std"):
            ref.cfg["input"][key] = [float(np.float32(v)) for v in ref.cfg["input"][key]]
        rst = {}
        with torch.no_grad():
            R.segment(ref, img, stages=rst)
        worst, where = 0.0, ""
        names = ["logits"] if slide else [k for k in st if k != "mask"]
        for k in names:
            a, b = rst[k], st[k]
            self.assertEqual(tuple(a.shape), tuple(b.shape), "%s %s" % (name, k))
            rel = ((a - b).abs().max() / b.abs().max().clamp(min=1)).item()
            if os.environ.get("MS_UPSTREAM_VERBOSE"):
                print("  %s %s rel %.3g" % (name, k, rel), file=sys.stderr)
            if rel > worst:
                worst, where = rel, k
        self.assertGreaterEqual(len(names), 1 if slide else 20, name)   # every stage, really
        self.assertLess(worst, 1e-9, "%s: reference vs mmseg, stage %s" % (name, where))
        mask_same = (rst["mask"] == st["mask"]).double().mean().item()
        self.assertEqual(mask_same, 1.0, name)

        g = {"image": torch.as_tensor(img)}
        for k in names + ["mask"]:
            v = st[k][0]
            g[k] = v.to(torch.uint8) if k == "mask" else v.to(torch.float32).contiguous()
        meta = {"case": name, "description": desc, "attention": "full"}
        if slide:
            meta["slide"] = "yes"
        prefix = model_path[:-len(".model.safetensors")]
        safetensors_io.save(prefix + ".golden.safetensors", g, meta)
        self.cases.append(prefix)
        eng = self.run_engine(prefix)
        cli = self.check_cli(name, model_path, img_path, st)
        report("| %s | %s | %s | %s | %s | %s |" % (
            name, desc, "0 (bit-identical)" if worst == 0 else "%.1e (%s)" % (worst, where),
            "identical" if mask_same == 1 else "%.4f" % mask_same, eng, cli))

    def run_engine(self, prefix):
        if not os.path.exists(ENGINE_TEST):
            return "engine not built (%s)" % ENGINE_TEST
        env = dict(os.environ, MS_GOLDEN_EXTRA=prefix, MS_GOLDEN_VERBOSE="1")
        p = subprocess.run([ENGINE_TEST], env=env, capture_output=True, text=True, timeout=600)
        self.assertEqual(p.returncode, 0, p.stdout[-3000:] + p.stderr[-3000:])
        worst, stage, lg, inp = 0.0, "", None, None
        for line in p.stderr.splitlines():
            parts = line.split()
            if len(parts) >= 6 and parts[0] == prefix and parts[-2] == "rel":
                rel = float(parts[-1])
                if parts[1] == "logits":
                    lg = rel
                if parts[1] == "input":
                    inp = rel
                if rel > worst:
                    worst, stage = rel, parts[1]
        self.assertIsNotNone(lg, "the engine's logits were not compared")
        return "%.1e (%s); input %s; logits %.1e" % (
            worst, stage, "-" if inp is None else "%.1e" % inp, lg)

    def run_case(self, name, desc, config, layout="1.x", backbone=None, test_cfg=None,
                 size_divisor=None, padded_logits="resize"):
        ck, model = self.build(config, layout, backbone, test_cfg, size_divisor)
        path = self.convert(ck, name)
        cfg = R.load_model(path).cfg
        cls_token = model.backbone.with_cls_token
        self.assertEqual(bool(cfg["backbone"].get("cls_token")), cls_token)
        self.assertEqual(cfg["input"]["short_side"], SHORT)           # from the config's Resize
        self.assertEqual(cfg["input"]["long_side"], 2048)
        self.assertEqual(cfg["input"]["resize"], "cv2_uint8")
        self.assertEqual(cfg["input"]["padded_logits"], padded_logits)
        img = make_image(7)
        from PIL import Image
        img_path = os.path.join(self.tmp.name, name + ".png")
        Image.fromarray(img).save(img_path)                           # lossless: both read img
        st = self.mmseg_stages(model, img_path, cls_token)
        self.compare(name, desc, path, st, img, img_path,
                     slide=bool(test_cfg and test_cfg.get("mode") == "slide"))
        return cfg

    def check_cli(self, name, model_path, img_path, st):
        """`mitaseg segment` on the same image file, no flags beyond the
        model: the mask is mmseg's (up to near-ties of its logits)."""
        exe = os.path.join(os.path.dirname(ENGINE_TEST), "mitaseg")
        if not os.path.exists(exe):
            return "-"
        from PIL import Image
        d = os.path.join(self.tmp.name, name + "_cli")
        os.makedirs(d, exist_ok=True)
        p = subprocess.run([exe, "segment", img_path, "-o", os.path.join(d, "out"),
                            "--model", model_path, "--format", "label", "--device", "cpu"],
                           capture_output=True, text=True, timeout=600)
        self.assertEqual(p.returncode, 0, p.stderr)
        got = np.asarray(Image.open(os.path.join(d, "out", os.path.basename(img_path))))
        want = st["mask"][0].numpy()
        lg = st["logits"][0].numpy()
        diff = np.argwhere(got != want)
        for y, x in diff:   # only where mmseg's own top two logits nearly tie
            self.assertLess(abs(lg[got[y, x], y, x] - lg[want[y, x], y, x]), 1e-4 * np.abs(lg).max(),
                            "%s: CLI mask pixel (%d, %d)" % (name, y, x))
        self.assertLessEqual(len(diff), got.size // 1000 + 1)
        return "identical" if len(diff) == 0 else "%d of %d pixels (near-ties)" % (len(diff), got.size)

    def test_deit_s_mln(self):
        cfg = self.run_case("deit_s_mln", "DeiT-S + MLN, class token (1.x, patch_bias=False)",
                            "vit/vit_deit-s16_mln_upernet_8xb2-160k_ade20k-512x512.py")
        self.assertEqual(cfg["backbone"]["num_heads"], 6)                # from meta.cfg

    def test_deit_s_mln_no_cls_0x(self):
        self.run_case("deit_s_mln_nocls_0x", "DeiT-S + MLN, with_cls_token=False (0.x layout)",
                      "vit/vit_deit-s16_mln_upernet_8xb2-160k_ade20k-512x512.py", layout="0.x",
                      backbone=dict(with_cls_token=False))

    def test_deit_s_final_norm(self):
        self.run_case("deit_s_ln_mln", "DeiT-S + MLN, final norm",
                      "vit/vit_deit-s16-ln_mln_upernet_8xb2-160k_ade20k-512x512.py")

    def test_deit_s_no_neck(self):
        self.run_case("deit_s_noneck", "DeiT-S, no neck",
                      "vit/vit_deit-s16_upernet_8xb2-80k_ade20k-512x512.py")

    def test_vit_b(self):
        cfg = self.run_case("vit_b_mln", "ViT-B + MLN (768 wide, 12 heads)",
                            "vit/vit_vit-b16_mln_upernet_8xb2-160k_ade20k-512x512.py", layout="0.x")
        self.assertEqual(cfg["backbone"]["num_heads"], 12)

    def test_padding_crop_behaviour(self):
        self.run_case("deit_s_crop", "DeiT-S + MLN, test-time size_divisor 16 (crop)",
                      "vit/vit_deit-s16_mln_upernet_8xb2-160k_ade20k-512x512.py",
                      size_divisor=16, padded_logits="crop")

    def test_slide(self):
        cfg = self.run_case("deit_s_slide", "DeiT-S + MLN, slide crop 40x56 stride 24x36",
                            "vit/vit_deit-s16_mln_upernet_8xb2-160k_ade20k-512x512.py",
                            test_cfg=dict(mode="slide", crop_size=(40, 56), stride=(24, 36)))
        self.assertEqual(cfg["input"]["slide"], {"crop": [40, 56], "stride": [24, 36]})


@unittest.skipIf(WHY_NOT is not None, "upstream libraries not importable (%s)" % WHY_NOT)
class TestOpenCVResize(unittest.TestCase):
    """input.resize cv2_uint8 against OpenCV itself (cv2.resize INTER_LINEAR,
    as mmcv.imresize calls it), byte for byte, on a sweep of sizes: up and
    down, odd and non-integer ratios, exact halves, 1-pixel sides, copies."""

    def test_engine_and_reference_match_cv2(self):
        import cv2
        import gen_resize_golden
        t, ver = gen_resize_golden.cases(many=True, seed=3)
        n = sum(k.startswith("dst.") for k in t)
        for k, want in t.items():       # the reference's (numpy) implementation
            if k.startswith("dst."):
                got = R.resize_uint8_cv2(t["src." + k.split(".")[1]], want.shape[:2])
                self.assertTrue(np.array_equal(got, want), "reference: %s %s" % (k, want.shape))
        exe = os.path.join(os.path.dirname(ENGINE_TEST), "test_image_resize")
        if not os.path.exists(exe):
            self.skipTest("engine not built (%s)" % exe)
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "resize.golden.safetensors")
            safetensors_io.save(path, t, {"producer": "opencv %s" % ver})
            env = dict(os.environ, MS_RESIZE_GOLDEN=path,
                       MS_FIXTURES=os.path.join(REPO, "tests", "fixtures"))
            p = subprocess.run([exe], env=env, capture_output=True, text=True, timeout=600)
            self.assertEqual(p.returncode, 0, p.stdout[-3000:] + p.stderr[-3000:])
        report("| cv2.resize INTER_LINEAR (opencv %s) | %d uint8 RGB resizes, %d sources 1x1 to "
               "360x480 | engine and reference byte-identical | - | - | - |"
               % (cv2.__version__, n, sum(k.startswith("src.") for k in t)))


@unittest.skipIf(WHY_NOT is not None, "upstream libraries not importable (%s)" % WHY_NOT)
class TestTimm(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()

    def tearDown(self):
        self.tmp.cleanup()

    def timm_model(self, name, **kw):
        m = timm.create_model(name, pretrained=False, depth=4, **kw).double().eval()
        randomise(m, 99)
        with torch.no_grad():   # the float32 values the checkpoint will hold
            for p in m.parameters():
                p.copy_(p.float().double())
        return m

    def convert(self, m, name):
        src, dst = os.path.join(self.tmp.name, name + ".pth"), os.path.join(self.tmp.name, name + ".pt")
        torch.save({"model": {k: v.float() for k, v in m.state_dict().items()},
                    "args": {"model": name}}, src)
        self.assertEqual(convert.main(["timm", src, dst]), 0)
        return dst, torch.load(dst)["backbone_config"]

    def test_deit_s_blocks_match_timm(self):
        m = self.timm_model("deit_small_patch16_224")
        dst, bb = self.convert(m, "deit_small_patch16_224")
        self.assertEqual((bb["num_heads"], bb["cls_token"], bb["pos_grid"]), (6, True, [14, 14]))
        cfg = {"backbone": dict(bb, out_indices=[0, 1, 2, 3], final_norm=True,
                                attention={"type": "full"}),
               "classes": ["a", "b"]}
        ours = R.MitaSeg(cfg).double().eval()
        loaded, skipped = convert.init_backbone(ours, dst)
        self.assertIn("backbone.cls_token", loaded)
        x = torch.randn(1, 3, 224, 224, dtype=torch.float64)
        got, st = [], {}
        hooks = [b.register_forward_hook(lambda mod, i, o: got.append(o)) for b in m.blocks]
        with torch.no_grad():
            feats = m.forward_features(x)       # includes the final norm, on every token
            ours.double()(x, stages=st)
        for h in hooks:
            h.remove()
        worst = 0.0
        for i in range(4):
            rel = ((st["blocks.%d" % i] - got[i]).abs().max() / got[i].abs().max()).item()
            worst = max(worst, rel)
        tap = feats[:, 1:].transpose(1, 2).reshape(1, -1, 14, 14)
        worst = max(worst, ((st["taps.3"] - tap).abs().max() / tap.abs().max()).item())
        self.assertLess(worst, 1e-9)
        report("| timm deit_small_patch16_224 | DeiT-S blocks + final norm, class token | %s | "
               "- | - | - |" % ("0 (bit-identical)" if worst == 0 else "%.1e" % worst))

    def test_pos_embed_resampled_as_timm(self):
        """--init-backbone resamples as timm's resample_abs_pos_embed (antialias)."""
        m = self.timm_model("deit_small_patch16_224")
        dst, bb = self.convert(m, "deit_small_patch16_224")
        pos = m.pos_embed.detach().float()
        for grid in ([23, 30], [10, 13]):
            cfg = {"backbone": dict(bb, pos_grid=grid, out_indices=[0, 1, 2, 3]),
                   "classes": ["a", "b"]}
            ours = R.MitaSeg(cfg)
            convert.init_backbone(ours, dst)
            want = timm.layers.resample_abs_pos_embed(pos, new_size=grid, old_size=[14, 14],
                                                      num_prefix_tokens=1)
            self.assertLess((ours.backbone.pos_embed.detach() - want).abs().max().item(), 1e-5)
            plain = R.resize_pos_embed(pos, (14, 14), grid, ncls=1)
            rel = ((plain - want)[:, 1:].abs().max() / want[:, 1:].abs().max()).item()
            self.assertGreater(rel, 1e-3)   # the two kernels really differ
            report("| timm pos_embed 14x14 -> %dx%d | antialiased vs plain bicubic | %.1e | - | - | - |"
                   % (grid[0], grid[1], rel))

    def test_distilled_deit_converts_with_a_note(self):
        m = self.timm_model("deit_small_distilled_patch16_224")
        src, dst = os.path.join(self.tmp.name, "d.pth"), os.path.join(self.tmp.name, "d.pt")
        torch.save({"model": {k: v.float() for k, v in m.state_dict().items()}}, src)
        import contextlib
        import io
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            self.assertEqual(convert.main(["timm", src, dst]), 0)
        self.assertIn("distillation token dropped", err.getvalue())
        ck = torch.load(dst)
        self.assertTrue(torch.equal(ck["state_dict"]["backbone.pos_embed"][:, 0],
                                    m.pos_embed[:, 0].float()))

    def test_mistakes_named(self):
        m = self.timm_model("deit_small_patch16_224")
        src = os.path.join(self.tmp.name, "t.pth")
        torch.save({"model": m.state_dict()}, src)
        import contextlib
        import io
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            self.assertEqual(convert.main(["mmseg", src, src + ".st"]), 2)
        self.assertIn("convert.py timm", err.getvalue())
        for name in ("swin_tiny_patch4_window7_224", "convnext_atto"):
            sw = timm.create_model(name, pretrained=False)
            torch.save(sw.state_dict(), src)
            err = io.StringIO()
            with contextlib.redirect_stderr(err):
                self.assertEqual(convert.main(["timm", src, src + ".pt"]), 2)
            self.assertIn("not a plain ViT", err.getvalue())


if __name__ == "__main__":
    unittest.main()
