"""tools/convert.py on state dicts built with the exact key names and shapes of
timm ViT, DeiT (distilled) and mmsegmentation UperNet-ViT checkpoints."""

import contextlib
import io
import os
import tempfile
import unittest

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from tools.tests import TOOLS_DIR  # noqa: F401  (puts tools/ on sys.path)
import convert
import mitaseg_ref as R

C, HEADS, PATCH, GRID = 32, 2, 16, 4      # tiny ViT: 4x4 patches + class token


def rnd(*shape):
    return torch.randn(*shape) * 0.2


# ---------------------------------------------------------------- timm / DeiT

def timm_vit(depth=2, dist=False, classes=10, grid=(GRID, GRID)):
    """timm VisionTransformer / DeiT state_dict keys and shapes, in module order."""
    n = grid[0] * grid[1]
    sd = {"cls_token": rnd(1, 1, C)}
    if dist:
        sd["dist_token"] = rnd(1, 1, C)
    sd["pos_embed"] = rnd(1, n + (2 if dist else 1), C)
    sd["patch_embed.proj.weight"] = rnd(C, 3, PATCH, PATCH)
    sd["patch_embed.proj.bias"] = rnd(C)
    for i in range(depth):
        b = "blocks.%d." % i
        sd[b + "norm1.weight"], sd[b + "norm1.bias"] = 1 + rnd(C), rnd(C)
        sd[b + "attn.qkv.weight"], sd[b + "attn.qkv.bias"] = rnd(3 * C, C), rnd(3 * C)
        sd[b + "attn.proj.weight"], sd[b + "attn.proj.bias"] = rnd(C, C), rnd(C)
        sd[b + "norm2.weight"], sd[b + "norm2.bias"] = 1 + rnd(C), rnd(C)
        sd[b + "mlp.fc1.weight"], sd[b + "mlp.fc1.bias"] = rnd(4 * C, C), rnd(4 * C)
        sd[b + "mlp.fc2.weight"], sd[b + "mlp.fc2.bias"] = rnd(C, 4 * C), rnd(C)
    sd["norm.weight"], sd["norm.bias"] = 1 + rnd(C), rnd(C)
    sd["head.weight"], sd["head.bias"] = rnd(classes, C), rnd(classes)
    if dist:
        sd["head_dist.weight"], sd["head_dist.bias"] = rnd(classes, C), rnd(classes)
    return sd


def timm_attention(x, qkv, proj, heads):
    """timm's Attention.forward, verbatim in substance."""
    B, N, Cx = x.shape
    t = qkv(x).reshape(B, N, 3, heads, Cx // heads).permute(2, 0, 3, 1, 4)
    q, k, v = t.unbind(0)
    attn = (q @ k.transpose(-2, -1)) * (Cx // heads) ** -0.5
    return proj((attn.softmax(dim=-1) @ v).transpose(1, 2).reshape(B, N, Cx))


def linear(sd, prefix):
    w = sd[prefix + ".weight"]
    m = nn.Linear(w.shape[1], w.shape[0])
    m.weight.data.copy_(w)
    m.bias.data.copy_(sd[prefix + ".bias"])
    return m


def timm_block(x, sd, i):
    b = "blocks.%d." % i
    ln = lambda t, n: F.layer_norm(t, (C,), sd[b + n + ".weight"], sd[b + n + ".bias"], 1e-6)
    x = x + timm_attention(ln(x, "norm1"), linear(sd, b + "attn.qkv"), linear(sd, b + "attn.proj"), HEADS)
    return x + linear(sd, b + "mlp.fc2")(F.gelu(linear(sd, b + "mlp.fc1")(ln(x, "norm2"))))


class Tmp(unittest.TestCase):
    def setUp(self):
        torch.manual_seed(0)
        self.tmp = tempfile.TemporaryDirectory()

    def tearDown(self):
        self.tmp.cleanup()

    def path(self, name):
        return os.path.join(self.tmp.name, name)

    def run_cli(self, *argv):
        """convert.main(argv) -> (exit code, stdout, stderr)."""
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            rc = convert.main([str(a) for a in argv])
        return rc, out.getvalue(), err.getvalue()

    def assert_fails(self, argv, *needles):
        rc, _, err = self.run_cli(*argv)
        self.assertEqual(rc, 2, err)
        self.assertEqual(len(err.strip().splitlines()), 1, err)   # one line
        for n in needles:
            self.assertIn(n, err)
        return err


class TestTimm(Tmp):
    def convert(self, obj, *flags):
        src, dst = self.path("in.pth"), self.path("out.pt")
        torch.save(obj, src)
        rc, _, err = self.run_cli("timm", src, dst, *flags)
        self.assertEqual(rc, 0, err)
        ck = convert.load_checkpoint(dst)
        return ck["state_dict"], ck["backbone_config"]

    def test_vit_renames_every_tensor(self):
        sd = timm_vit()
        out, bb = self.convert(sd, "--num-heads", HEADS)
        want = {"backbone." + k for k in sd if k not in ("head.weight", "head.bias")}
        self.assertEqual(set(out), want)
        for k, v in sd.items():
            if k in ("head.weight", "head.bias"):
                continue
            # the class token and its position slot (first) are kept (mita-spec 1)
            self.assertTrue(torch.equal(out["backbone." + k], v), k)
        self.assertEqual(bb, {"patch_size": PATCH, "embed_dim": C, "depth": 2, "num_heads": HEADS,
                              "stem": {"type": "patch"}, "mlp_ratio": 4, "ln_eps": 1e-6,
                              "pos_grid": [GRID, GRID], "final_norm": True, "cls_token": True})

    def test_deit_wrapper_with_distillation_token(self):
        sd = timm_vit(dist=True)
        out, bb = self.convert({"model": sd, "optimizer": {}, "epoch": 299}, "--num-heads", HEADS)
        self.assertNotIn("backbone.dist_token", out)
        self.assertFalse(any("head" in k for k in out))
        # class AND distillation slots come first in DeiT's pos_embed: the
        # class slot is kept, the distillation slot dropped
        self.assertEqual(tuple(out["backbone.pos_embed"].shape), (1, 1 + GRID * GRID, C))
        self.assertTrue(torch.equal(out["backbone.pos_embed"],
                                    torch.cat([sd["pos_embed"][:, :1], sd["pos_embed"][:, 2:]], 1)))
        self.assertTrue(torch.equal(out["backbone.cls_token"], sd["cls_token"]))
        self.assertTrue(torch.equal(out["backbone.blocks.1.attn.qkv.weight"], sd["blocks.1.attn.qkv.weight"]))

    def test_ddp_prefix_and_non_square_grid(self):
        sd = {"module." + k: v for k, v in timm_vit(grid=(2, 6)).items()}
        src = self.path("in.pth")
        torch.save(sd, src)
        self.assert_fails(("timm", src, self.path("o.pt"), "--num-heads", 2), src, "not a square")
        out, bb = self.convert(sd, "--num-heads", 2, "--pos-grid", "2x6")
        self.assertEqual(bb["pos_grid"], [2, 6])
        self.assertTrue(torch.equal(out["backbone.pos_embed"], sd["module.pos_embed"]))

    def test_converted_block_equals_timm_block(self):
        """Our Block (full attention) on the renamed tensors = timm's block on
        the original ones: the qkv row layout (q, k, v; heads contiguous) agrees."""
        sd = timm_vit()
        out, bb = self.convert(sd, "--num-heads", HEADS)
        blk = R.Block(C, HEADS, 4, 1e-6)
        blk.load_state_dict({k[len("backbone.blocks.1."):]: v for k, v in out.items()
                             if k.startswith("backbone.blocks.1.")})
        x = torch.randn(2, GRID * GRID, C)
        with torch.no_grad():
            ours = blk(x, (GRID, GRID), {"type": "full"})
            theirs = timm_block(x, sd, 1)
        # same float32 ops in a different order: ~1e-6 relative on O(1) values
        self.assertLess((ours - theirs).abs().max().item(), 1e-4)

    def test_init_backbone_into_a_training_model(self):
        _, bb = self.convert(timm_vit(depth=4), "--num-heads", HEADS)
        dst = self.path("out.pt")
        cfg = {"backbone": {"embed_dim": C, "depth": 4, "num_heads": HEADS, "pos_grid": [2, 3],
                            "out_indices": [0, 1, 2, 3]},
               "classes": ["a", "b"]}
        model = R.MitaSeg(cfg)
        loaded, skipped = convert.init_backbone(model, dst)
        src = convert.load_checkpoint(dst)["state_dict"]
        # final_norm false; no class token in this model
        self.assertEqual(skipped, ["backbone.cls_token", "backbone.norm.weight", "backbone.norm.bias"])
        self.assertIn("backbone.blocks.3.mlp.fc2.bias", loaded)
        own = model.state_dict()
        for k in ("backbone.blocks.2.attn.qkv.weight", "backbone.patch_embed.proj.weight"):
            self.assertTrue(torch.equal(own[k], src[k]), k)
        # 4x4 position embedding resized to the 2x3 training grid as timm
        # would (antialiased bicubic), the class slot dropped with the token
        grid_pos = src["backbone.pos_embed"][:, 1:].reshape(1, 4, 4, C).permute(0, 3, 1, 2)
        want = F.interpolate(grid_pos, size=(2, 3), mode="bicubic", align_corners=False,
                             antialias=True).permute(0, 2, 3, 1).reshape(1, 6, C)
        self.assertTrue(torch.allclose(own["backbone.pos_embed"], want))
        self.assertFalse(torch.allclose(own["backbone.pos_embed"],
                                        R.resize_pos_embed(src["backbone.pos_embed"][:, 1:],
                                                           (4, 4), (2, 3))))
        # a model with a class token takes it, and its unresized slot
        cfg["backbone"]["cls_token"] = True
        m2 = R.MitaSeg(cfg)
        loaded, _ = convert.init_backbone(m2, dst)
        self.assertIn("backbone.cls_token", loaded)
        own2 = m2.state_dict()
        self.assertTrue(torch.equal(own2["backbone.cls_token"], src["backbone.cls_token"]))
        self.assertTrue(torch.equal(own2["backbone.pos_embed"][:, 0], src["backbone.pos_embed"][:, 0]))
        self.assertTrue(torch.allclose(own2["backbone.pos_embed"][:, 1:], want))
        del cfg["backbone"]["cls_token"]
        # a conv-stem model takes everything but the patch stem
        cfg["backbone"]["stem"] = {"type": "conv", "channels": [4, 8, 16, 32]}
        _, skipped = convert.init_backbone(R.MitaSeg(cfg), dst)
        self.assertIn("backbone.patch_embed.proj.weight", skipped)
        # another width is an error, not a silent partial load
        cfg["backbone"].update(embed_dim=64, stem={"type": "patch"})
        with self.assertRaises(convert.ConvertError) as cm:
            convert.init_backbone(R.MitaSeg(cfg), dst)
        self.assertIn(dst, str(cm.exception))

    def test_unknown_layouts_fail_with_one_line(self):
        sd = timm_vit()
        sd["blocks.0.ls1.gamma"] = rnd(C)          # LayerScale: not our architecture
        src = self.path("ls.pth")
        torch.save(sd, src)
        self.assert_fails(("timm", src, self.path("o.pt"), "--num-heads", HEADS), src, "'blocks.0.ls1.gamma'")
        # an mmseg checkpoint is not a timm backbone: say which subcommand fits
        torch.save(mmseg_upernet(), src)
        self.assert_fails(("timm", src, self.path("o.pt")), src, "convert.py mmseg")
        # Swin and ConvNeXt are not plain ViTs
        torch.save({"state_dict": {"backbone.stages.0.blocks.0.attn.w_msa.relative_position_bias_table":
                                   rnd(49, 3), "backbone.patch_embed.projection.weight": rnd(C, 3, 4, 4)}},
                   src)
        for kind in ("timm", "mmseg"):
            self.assert_fails((kind, src, self.path("o.pt")), src, "Swin", "not a plain ViT")
        torch.save({"model": {"stem.0.weight": rnd(C, 3, 4, 4), "stages.0.blocks.0.conv_dw.weight":
                              rnd(C, 1, 7, 7)}}, src)
        for kind in ("timm", "mmseg"):
            self.assert_fails((kind, src, self.path("o.pt")), src, "ConvNeXt", "not a plain ViT")
        # the head count of width 32 cannot be guessed
        torch.save(timm_vit(), src)
        self.assert_fails(("timm", src, self.path("o.pt")), "--num-heads")
        # a DeiT checkpoint names its model: a contradicting --num-heads is refused
        torch.save({"model": timm_vit(), "args": {"model": "deit_small_patch16_224"}}, src)
        self.assert_fails(("timm", src, self.path("o.pt"), "--num-heads", 2), src, "args.model",
                          "6 heads")
        # missing file, not a checkpoint
        self.assert_fails(("timm", self.path("nope.pth"), self.path("o.pt")), "nope.pth")
        with open(src, "wb") as f:
            f.write(b"not a pickle")
        self.assert_fails(("timm", src, self.path("o.pt")), src)


# ---------------------------------------------------------------- mmseg

def conv_module(sd, prefix, cout, cin, k):
    """mmseg ConvModule with BN (conv without bias)."""
    sd[prefix + ".conv.weight"] = rnd(cout, cin, k, k)
    sd[prefix + ".bn.weight"] = 1 + rnd(cout)
    sd[prefix + ".bn.bias"] = rnd(cout)
    sd[prefix + ".bn.running_mean"] = rnd(cout)
    sd[prefix + ".bn.running_var"] = torch.rand(cout) + 0.5
    sd[prefix + ".bn.num_batches_tracked"] = torch.tensor(1000)


def mmseg_upernet(depth=4, neck_ch=16, ch=16, classes=5, final_norm=True, neck=True):
    """mmseg EncoderDecoder(VisionTransformer, MultiLevelNeck, UPerHead, FCNHead)
    state_dict keys and shapes, in module order."""
    sd = {"backbone.cls_token": rnd(1, 1, C),
          "backbone.pos_embed": rnd(1, 1 + GRID * GRID, C),
          "backbone.patch_embed.projection.weight": rnd(C, 3, PATCH, PATCH),
          "backbone.patch_embed.projection.bias": rnd(C)}
    for i in range(depth):
        b = "backbone.layers.%d." % i
        sd[b + "ln1.weight"], sd[b + "ln1.bias"] = 1 + rnd(C), rnd(C)
        sd[b + "attn.attn.in_proj_weight"], sd[b + "attn.attn.in_proj_bias"] = rnd(3 * C, C), rnd(3 * C)
        sd[b + "attn.attn.out_proj.weight"], sd[b + "attn.attn.out_proj.bias"] = rnd(C, C), rnd(C)
        sd[b + "ln2.weight"], sd[b + "ln2.bias"] = 1 + rnd(C), rnd(C)
        sd[b + "ffn.layers.0.0.weight"], sd[b + "ffn.layers.0.0.bias"] = rnd(4 * C, C), rnd(4 * C)
        sd[b + "ffn.layers.1.weight"], sd[b + "ffn.layers.1.bias"] = rnd(C, 4 * C), rnd(C)
    if final_norm:
        sd["backbone.ln1.weight"], sd["backbone.ln1.bias"] = 1 + rnd(C), rnd(C)
    cin = C
    if neck:
        for l in range(4):
            sd["neck.lateral_convs.%d.conv.weight" % l] = rnd(neck_ch, C, 1, 1)
            sd["neck.lateral_convs.%d.conv.bias" % l] = rnd(neck_ch)
        for l in range(4):
            sd["neck.convs.%d.conv.weight" % l] = rnd(neck_ch, neck_ch, 3, 3)
            sd["neck.convs.%d.conv.bias" % l] = rnd(neck_ch)
        cin = neck_ch
    sd["decode_head.conv_seg.weight"], sd["decode_head.conv_seg.bias"] = rnd(classes, ch, 1, 1), rnd(classes)
    for j in range(4):
        conv_module(sd, "decode_head.psp_modules.%d.1" % j, ch, cin, 1)
    conv_module(sd, "decode_head.bottleneck", ch, cin + 4 * ch, 3)
    for l in range(3):
        conv_module(sd, "decode_head.lateral_convs.%d" % l, ch, cin, 1)
    for l in range(3):
        conv_module(sd, "decode_head.fpn_convs.%d" % l, ch, ch, 3)
    conv_module(sd, "decode_head.fpn_bottleneck", ch, 4 * ch, 3)
    sd["auxiliary_head.conv_seg.weight"] = rnd(classes, 8, 1, 1)
    sd["auxiliary_head.conv_seg.bias"] = rnd(classes)
    conv_module(sd, "auxiliary_head.convs.0", 8, cin, 3)
    return {"meta": {"mmseg_version": "0.30.0", "epoch": 160, "iter": 160000}, "state_dict": sd}


# Our name for each mmseg name, written out independently of convert.py.
def mmseg_to_ours(k):
    if k.startswith("backbone.layers."):
        i, rest = k[len("backbone.layers."):].split(".", 1)
        rest = {"ln1.weight": "norm1.weight", "ln1.bias": "norm1.bias",
                "ln2.weight": "norm2.weight", "ln2.bias": "norm2.bias",
                "attn.attn.in_proj_weight": "attn.qkv.weight", "attn.attn.in_proj_bias": "attn.qkv.bias",
                "attn.attn.out_proj.weight": "attn.proj.weight", "attn.attn.out_proj.bias": "attn.proj.bias",
                "ffn.layers.0.0.weight": "mlp.fc1.weight", "ffn.layers.0.0.bias": "mlp.fc1.bias",
                "ffn.layers.1.weight": "mlp.fc2.weight", "ffn.layers.1.bias": "mlp.fc2.bias"}[rest]
        return "backbone.blocks.%s.%s" % (i, rest)
    if k.startswith("backbone.patch_embed.projection."):
        return k.replace("projection", "proj")
    if k.startswith("backbone.ln1."):
        return k.replace("ln1", "norm")
    if k.startswith("auxiliary_head.") or k.endswith("num_batches_tracked"):
        return None
    return k    # pos_embed (sliced), neck.*, decode_head.*


def mmseg_vit_taps(sd, x, out_indices, heads, with_cls=False):
    """mmseg VisionTransformer.forward (with_cls_token as given, final_norm)
    built from nn.MultiheadAttention and nn.Sequential FFNs holding the mmseg
    tensors: the class token is prepended, the position embedding added, and
    the token dropped again unless with_cls; taps drop it."""
    p = "backbone."
    t = F.conv2d(x, sd[p + "patch_embed.projection.weight"], sd.get(p + "patch_embed.projection.bias"),
                 stride=PATCH)
    B, _, hp, wp = t.shape
    t = torch.cat([sd[p + "cls_token"].expand(B, -1, -1), t.flatten(2).transpose(1, 2)], 1)
    t = t + sd[p + "pos_embed"]
    if not with_cls:
        t = t[:, 1:]
    depth = len({k.split(".")[2] for k in sd if k.startswith(p + "layers.")})
    taps = []
    for i in range(depth):
        b = p + "layers.%d." % i
        mha = nn.MultiheadAttention(C, heads, batch_first=True)
        mha.in_proj_weight.data.copy_(sd[b + "attn.attn.in_proj_weight"])
        mha.in_proj_bias.data.copy_(sd[b + "attn.attn.in_proj_bias"])
        mha.out_proj.weight.data.copy_(sd[b + "attn.attn.out_proj.weight"])
        mha.out_proj.bias.data.copy_(sd[b + "attn.attn.out_proj.bias"])
        ffn = nn.Sequential(nn.Sequential(nn.Linear(C, 4 * C), nn.GELU()), nn.Linear(4 * C, C))
        ffn[0][0].weight.data.copy_(sd[b + "ffn.layers.0.0.weight"])
        ffn[0][0].bias.data.copy_(sd[b + "ffn.layers.0.0.bias"])
        ffn[1].weight.data.copy_(sd[b + "ffn.layers.1.weight"])
        ffn[1].bias.data.copy_(sd[b + "ffn.layers.1.bias"])
        h = F.layer_norm(t, (C,), sd[b + "ln1.weight"], sd[b + "ln1.bias"], 1e-6)
        t = t + mha(h, h, h, need_weights=False)[0]
        t = t + ffn(F.layer_norm(t, (C,), sd[b + "ln2.weight"], sd[b + "ln2.bias"], 1e-6))
        if i == depth - 1 and p + "ln1.weight" in sd:
            t = F.layer_norm(t, (C,), sd[p + "ln1.weight"], sd[p + "ln1.bias"], 1e-6)
        if i in out_indices:
            o = t[:, 1:] if with_cls else t
            taps.append(o.transpose(1, 2).reshape(B, C, hp, wp))
    return taps


def mmseg_mln(sd, taps, scales=(4, 2, 1, 0.5)):
    """mmseg MultiLevelNeck.forward (norm_cfg=None)."""
    outs = []
    for l, t in enumerate(taps):
        t = F.conv2d(t, sd["neck.lateral_convs.%d.conv.weight" % l], sd["neck.lateral_convs.%d.conv.bias" % l])
        t = F.interpolate(t, scale_factor=scales[l], mode="bilinear")
        outs.append(F.conv2d(t, sd["neck.convs.%d.conv.weight" % l], sd["neck.convs.%d.conv.bias" % l],
                             padding=1))
    return outs


class TestMmseg(Tmp):
    def convert(self, ck, *flags):
        src, dst = self.path("upernet.pth"), self.path("model.safetensors")
        torch.save(ck, src)
        rc, _, err = self.run_cli("mmseg", src, dst, *flags)
        self.assertEqual(rc, 0, err)
        return R.load_model(dst)

    def test_every_tensor_lands_under_our_name(self):
        ck = mmseg_upernet()
        sd = ck["state_dict"]
        model = self.convert(ck, "--num-heads", HEADS)
        got = R.model_tensors(model)
        self.assertEqual(model.extra_tensors, [])
        mapped = {}
        for k, v in sd.items():
            ours = mmseg_to_ours(k)
            if ours is None:
                continue
            mapped[ours] = v   # class token and its position slot kept (with_cls_token)
        self.assertEqual(set(got), set(mapped))     # no aux head, nothing missing
        for k, v in mapped.items():
            self.assertTrue(torch.equal(got[k], v.float()), k)
        self.assertTrue(torch.equal(got["backbone.blocks.3.attn.qkv.weight"],
                                    sd["backbone.layers.3.attn.attn.in_proj_weight"]))

    def test_config_inferred_from_shapes_and_flags(self):
        ck = mmseg_upernet(classes=3)
        ck["meta"]["CLASSES"] = ("road", "car", "sky")
        ck["meta"]["PALETTE"] = [[1, 2, 3], [4, 5, 6], [7, 8, 9]]
        cfg = self.convert(ck, "--num-heads", HEADS, "--landmarks", "3x2", "--topk", 5,
                           "--shared-scale", "sqrt_d", "--short-side", 128).cfg
        bb = cfg["backbone"]
        self.assertEqual((bb["embed_dim"], bb["depth"], bb["num_heads"], bb["patch_size"]), (C, 4, HEADS, PATCH))
        self.assertEqual((bb["pos_grid"], bb["out_indices"], bb["final_norm"], bb["mlp_ratio"]),
                         ([GRID, GRID], [0, 1, 2, 3], True, 4))
        self.assertEqual(bb["attention"], {"type": "mita", "landmarks": [3, 2], "topk": 5,
                                           "shared_scale": "sqrt_d"})
        self.assertEqual(cfg["neck"], {"type": "mln", "out_channels": 16})
        self.assertEqual((cfg["decoder"]["channels"], cfg["decoder"]["pool_scales"]), (16, [1, 2, 3, 6]))
        self.assertEqual(cfg["classes"], ["road", "car", "sky"])    # from the checkpoint's meta
        self.assertEqual(cfg["palette"], [[1, 2, 3], [4, 5, 6], [7, 8, 9]])
        self.assertEqual((cfg["input"]["short_side"], cfg["input"]["pad_multiple"]), (128, PATCH))
        self.assertEqual(cfg["input"]["mean"], R.IMAGENET_MEAN)
        self.assertIn("upernet.pth", cfg["provenance"])
        # class names and palette from files override the meta
        names, pal = self.path("names.txt"), self.path("pal.txt")
        with open(names, "w") as f:
            f.write("a\nb\nc\n")
        with open(pal, "w") as f:
            f.write("10 20 30\n40 50 60\n70 80 90\n")
        cfg = self.convert(ck, "--num-heads", HEADS, "--classes", names, "--palette", pal,
                           "--attention", "full").cfg
        self.assertEqual((cfg["classes"], cfg["palette"][2]), (["a", "b", "c"], [70, 80, 90]))
        self.assertEqual(cfg["backbone"]["attention"]["type"], "full")
        self.assertEqual(cfg["input"]["short_side"], None)

    def test_converted_model_matches_mmseg_forward(self):
        for cls in (False, True):
            with self.subTest(with_cls_token=cls):
                self.check_mmseg_forward(cls)

    def check_mmseg_forward(self, cls):
        """Backbone taps and neck of the converted model (full attention) equal
        mmseg's ViT (nn.MultiheadAttention with in_proj/out_proj, FFN layers)
        and MultiLevelNeck on the original tensors; the head keeps mmseg's names.
        Then the whole pipeline runs at an image size that needs resize + padding."""
        ck = mmseg_upernet()
        sd = ck["state_dict"]
        model = self.convert(ck, "--num-heads", HEADS, "--short-side", 64, "--cls-token",
                             "on" if cls else "off")
        self.assertEqual(model.cfg["backbone"].get("cls_token", False), cls)
        x = torch.randn(1, 3, 64, 96)       # 4x6 tokens: pos_embed resized from 4x4
        with torch.no_grad():
            stages = {}
            model(x, attn={"type": "full"}, stages=stages)
            # compare on the model's own grid so both sides use the same pos_embed
            x4 = x[..., :64, :64]
            st4 = {}
            model(x4, attn={"type": "full"}, stages=st4)
            taps = mmseg_vit_taps(sd, x4, [0, 1, 2, 3], HEADS, with_cls=cls)
            neck = mmseg_mln(sd, taps)
        # float32, different op order (fused MHA vs. split matmuls): ~1e-6 relative
        for j in range(4):
            self.assertLess((st4["taps.%d" % j] - taps[j]).abs().max().item(), 1e-4, j)
            self.assertLess((st4["neck.%d" % j] - neck[j]).abs().max().item(), 1e-4, j)
        self.assertEqual(tuple(stages["head.logits"].shape), (1, 5, 16, 24))   # level 0 = 4x upsampled
        img = np.random.default_rng(0).integers(0, 256, (50, 90, 3), dtype=np.uint8)
        with torch.no_grad():
            mask, logits = R.segment(model, img)
        self.assertEqual((tuple(mask.shape), tuple(logits.shape)), ((50, 90), (5, 50, 90)))

    def test_no_neck_no_final_norm_f16(self):
        ck = mmseg_upernet(neck=False, final_norm=False, ch=8)
        model = self.convert(ck, "--num-heads", HEADS, "--dtype", "F16", "--out-indices", "0,1,2,3")
        cfg = model.cfg
        self.assertEqual((cfg["neck"], cfg["backbone"]["final_norm"]), ({"type": "none"}, False))
        w = ck["state_dict"]["decode_head.bottleneck.conv.weight"]
        self.assertTrue(torch.equal(model.state_dict()["decode_head.bottleneck.conv.weight"], w.half().float()))
        with torch.no_grad():
            self.assertEqual(tuple(model(torch.randn(1, 3, 64, 64)).shape), (1, 5, 4, 4))

    def test_mmseg_1x_defaults_and_training_config(self):
        """mmseg 1.x: patch_bias=False (no projection bias: a zero bias, noted);
        the training config in meta.cfg gives heads, with_cls_token and the test
        set-up (Resize scale, slide crop/stride)."""
        ck = mmseg_upernet()
        sd = ck["state_dict"]
        del sd["backbone.patch_embed.projection.bias"]
        ck["meta"] = {"cfg": (
            "crop_size = (512, 512)\n"
            "model = dict(\n    type='EncoderDecoder',\n    backbone=dict(\n        type='VisionTransformer',\n"
            "        num_heads=2,\n        with_cls_token=False,\n        patch_bias=False),\n"
            "    neck=dict(type='MultiLevelNeck', num_heads=99),\n"
            "    test_cfg=dict(mode='slide', crop_size=(48, 64), stride=(32, 40)))\n"
            "test_pipeline = [\n    dict(type='LoadImageFromFile'),\n"
            "    dict(type='Resize', scale=(2048, 96), keep_ratio=True),\n    dict(type='PackSegInputs')\n]\n")}
        src, dst = self.path("upernet.pth"), self.path("model.safetensors")
        torch.save(ck, src)
        rc, _, err = self.run_cli("mmseg", src, dst)
        self.assertEqual(rc, 0, err)
        self.assertIn("patch_bias=False", err)                 # the note
        model = R.load_model(dst)
        cfg = model.cfg
        self.assertEqual(cfg["backbone"]["num_heads"], 2)       # the backbone's, not the neck's
        self.assertFalse(cfg["backbone"].get("cls_token", False))
        self.assertEqual(cfg["input"]["short_side"], 96)
        self.assertEqual(cfg["input"]["long_side"], 2048)       # Resize scale (2048, 96)
        self.assertEqual(cfg["input"]["resize"], "cv2_uint8")   # mmcv.imresize's OpenCV
        self.assertEqual(cfg["input"]["slide"], {"crop": [48, 64], "stride": [32, 40]})
        self.assertEqual(cfg["input"]["padded_logits"], "resize")
        self.assertTrue(torch.equal(model.state_dict()["backbone.patch_embed.proj.bias"], torch.zeros(C)))
        x = torch.randn(1, 3, 64, 64)
        with torch.no_grad():
            st = {}
            model(x, attn={"type": "full"}, stages=st)
            taps = mmseg_vit_taps(sd, x, [0, 1, 2, 3], HEADS, with_cls=False)
        self.assertLess((st["taps.3"] - taps[3]).abs().max().item(), 1e-4)
        # a data preprocessor that pads at test time: mmseg crops the padding
        ck["meta"]["cfg"] += ("data_preprocessor = dict(\n    test_cfg=dict(size_divisor=32),\n"
                              "    type='SegDataPreProcessor')\n")
        torch.save(ck, src)
        rc, _, err = self.run_cli("mmseg", src, dst)
        self.assertEqual(rc, 0, err)
        inp = R.load_model(dst).cfg["input"]
        self.assertEqual((inp["padded_logits"], inp["pad_multiple"]), ("crop", 32))
        # flags win over the config
        rc, _, err = self.run_cli("mmseg", src, dst, "--slide", "none", "--short-side", 80,
                                  "--padded-logits", "crop", "--cls-token", "on",
                                  "--resize", "float", "--long-side", 300)
        self.assertEqual(rc, 0, err)
        cfg = R.load_model(dst).cfg
        self.assertNotIn("slide", cfg["input"])
        self.assertEqual((cfg["input"]["resize"], cfg["input"]["long_side"]), ("float", 300))
        self.assertEqual((cfg["input"]["short_side"], cfg["input"]["padded_logits"]), (80, "crop"))
        self.assertTrue(cfg["backbone"]["cls_token"])

    def test_ade20k_head_gets_the_ade20k_test_setup(self):
        ck = mmseg_upernet(classes=150)
        ck["meta"]["CLASSES"] = ["wall"] + ["c%d" % i for i in range(149)]
        ck["meta"]["PALETTE"] = [[i, i, i] for i in range(150)]
        src, dst = self.path("ade.pth"), self.path("model.safetensors")
        torch.save(ck, src)
        rc, _, err = self.run_cli("mmseg", src, dst, "--num-heads", HEADS)
        self.assertEqual(rc, 0, err)
        self.assertIn("ADE20K", err)
        inp = R.load_model(dst).cfg["input"]
        # mmseg's ViT-UperNet ADE20K configs test the whole image (mode='whole')
        self.assertEqual((inp["short_side"], inp.get("slide")), (512, None))
        self.assertEqual((inp["long_side"], inp["resize"]), (2048, "cv2_uint8"))  # scale (2048, 512)
        rc, _, err = self.run_cli("mmseg", src, dst, "--num-heads", HEADS, "--slide", "512,341")
        self.assertEqual(rc, 0, err)
        inp = R.load_model(dst).cfg["input"]
        self.assertEqual(inp["slide"], {"crop": [512, 512], "stride": [341, 341]})

    def test_head_count_notes(self):
        """Without metadata the head count cannot be checked: a note names the
        published value for the width (ViT-S: 6)."""
        global C
        saved = C
        try:
            C = 384
            ck = mmseg_upernet(depth=4)
        finally:
            C = saved
        src, dst = self.path("vits.pth"), self.path("model.safetensors")
        torch.save(ck, src)
        rc, _, err = self.run_cli("mmseg", src, dst, "--num-heads", 12)
        self.assertEqual(rc, 0, err)
        self.assertIn("published ViT-S (width 384) has 6", err)
        rc, _, err = self.run_cli("mmseg", src, dst)
        self.assertEqual(rc, 0, err)
        self.assertIn("using 6", err)
        self.assertEqual(R.load_model(dst).cfg["backbone"]["num_heads"], 6)

    def test_bad_checkpoints_fail_with_one_line(self):
        src, dst = self.path("bad.pth"), self.path("o.safetensors")
        ck = mmseg_upernet()
        ck["state_dict"]["backbone.pre_ln.weight"] = rnd(C)     # pre_norm ViT: unsupported
        torch.save(ck, src)
        self.assert_fails(("mmseg", src, dst, "--num-heads", HEADS), src, "'backbone.pre_ln.weight'")
        ck = mmseg_upernet()
        del ck["state_dict"]["decode_head.fpn_convs.1.bn.running_var"]
        torch.save(ck, src)
        self.assert_fails(("mmseg", src, dst, "--num-heads", HEADS), src,
                          "'decode_head.fpn_convs.1.bn.running_var'")
        torch.save({"model": timm_vit()}, src)                  # a timm backbone is not a segmenter
        self.assert_fails(("mmseg", src, dst), src, "convert.py timm")
        # messages name the checkpoint's own keys, not the renamed ones
        ck = mmseg_upernet()
        del ck["state_dict"]["backbone.layers.1.ln2.bias"]
        torch.save(ck, src)
        self.assert_fails(("mmseg", src, dst, "--num-heads", HEADS), src, "'backbone.layers.1.ln2.bias'")
        ck = mmseg_upernet()
        ck["state_dict"]["backbone.layers.0.ffn.layers.0.0.weight"] = rnd(4 * C, C + 1)
        torch.save(ck, src)
        self.assert_fails(("mmseg", src, dst, "--num-heads", HEADS), src,
                          "'backbone.layers.0.ffn.layers.0.0.weight'")
        ck = mmseg_upernet()
        ck["meta"]["config"] = "model = dict(backbone=dict(type='VisionTransformer', num_heads=4), neck=None)"
        torch.save(ck, src)
        self.assert_fails(("mmseg", src, dst, "--num-heads", HEADS), src, "--num-heads 2", "4 heads")
        torch.save(mmseg_upernet(), src)
        names = self.path("names.txt")
        with open(names, "w") as f:
            f.write("only\ntwo\n")
        self.assert_fails(("mmseg", src, dst, "--num-heads", HEADS, "--classes", names), "5 classes", "2 names")
        # the final norm follows the last block in mmseg; a tap elsewhere would differ
        self.assert_fails(("mmseg", src, dst, "--num-heads", HEADS, "--out-indices", "0,1,2,2"), "out_indices")
        self.assert_fails(("mmseg", src, dst, "--num-heads", 5), "not divisible")
        self.assertFalse(os.path.exists(dst))


if __name__ == "__main__":
    unittest.main()
