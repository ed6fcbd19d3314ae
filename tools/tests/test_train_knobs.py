"""The recipe knobs of tools/train.py, each on its own small input, plus the
leave-one-sequence-out folds of tools/make_splits.py.

Expected values are computed here from the definitions (hand formulas, naive
loops), not by calling the code under test a second way."""

import json
import math
import os
import random
import tempfile
import unittest
from unittest import mock

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image

from tools.tests import TOOLS_DIR  # noqa: F401  (puts tools/ on sys.path)
import convert
import make_splits
import train as T
import mitaseg_ref as R


def write_camvid_like(root, names_by_list, size=(8, 12)):
    """Tiny PNG images/labels under root/{img,lab}/ and the list files."""
    os.makedirs(os.path.join(root, "img"), exist_ok=True)
    os.makedirs(os.path.join(root, "lab"), exist_ok=True)
    for lst, names in names_by_list.items():
        with open(os.path.join(root, lst), "w") as f:
            for n in names:
                Image.fromarray(np.zeros(size + (3,), np.uint8)).save(os.path.join(root, "img", n))
                Image.fromarray(np.zeros(size, np.uint8)).save(os.path.join(root, "lab", n))
                f.write("img/%s lab/%s\n" % (n, n))


class TestSplits(unittest.TestCase):
    NAMES = {"train.txt": ["0001TP_1.png", "0006R0_1.png", "0006R0_2.png", "0016E5_1.png"],
             "val.txt": ["0016E5_9.png", "0016E5_8.png"]}

    def test_fold_holds_out_one_sequence(self):
        with tempfile.TemporaryDirectory() as root:
            write_camvid_like(root, self.NAMES)
            pool = make_splits.pool_pairs(root)
            self.assertEqual(len(pool), 6)
            train, val = make_splits.fold(pool, "0006R0")
            self.assertEqual(sorted(os.path.basename(p[0]) for p in val), ["0006R0_1.png", "0006R0_2.png"])
            self.assertEqual(len(train), 4)
            self.assertFalse({p[0] for p in train} & {p[0] for p in val})
            # val frames of the training lists join the pool (train + val minus the held-out sequence)
            self.assertIn("0016E5_9.png", [os.path.basename(p[0]) for p in train])
            with self.assertRaises(ValueError) as cm:
                make_splits.fold(pool, "Seq05VD")
            self.assertIn("0001TP 0006R0 0016E5", str(cm.exception))

    def test_cli_lists_resolve_and_train_agrees(self):
        with tempfile.TemporaryDirectory() as root:
            write_camvid_like(os.path.join(root, "data"), self.NAMES)
            out = os.path.join(root, "splits")
            self.assertEqual(make_splits.main([os.path.join(root, "data"), out]), 0)
            self.assertEqual(sorted(os.listdir(out)), ["xseq-0001TP", "xseq-0006R0", "xseq-0016E5"])
            lst = os.path.join(out, "xseq-0016E5", "val.txt")
            pairs = make_splits.read_list(lst)
            self.assertEqual(len(pairs), 3)
            for img, lab in pairs:       # relative paths resolve from the list's folder
                self.assertTrue(os.path.exists(img) and os.path.exists(lab), img)
            tr, va, desc = T.data_pairs(os.path.join(root, "data"), {"train_list": "train.txt",
                                                                     "val_list": "val.txt"}, "0016E5")
            self.assertEqual([os.path.realpath(p[0]) for p in va], [os.path.realpath(p[0]) for p in pairs])
            self.assertIn("0016E5", desc)
            self.assertEqual(make_splits.main([os.path.join(root, "data"), out, "--holdout", "nope"]), 1)
            # the final model's data: train_list naming both lists, no holdout
            tr, va, desc = T.data_pairs(os.path.join(root, "data"), {"train_list": ["train.txt", "val.txt"],
                                                                     "val_list": "val.txt"}, None)
            self.assertEqual((len(tr), len(va)), (6, 2))
            self.assertIn("train.txt + val.txt (6 frames)", desc)
            self.assertIn("val.txt (2 frames, all in the training set)", desc)
            tr, va, desc = T.data_pairs(os.path.join(root, "data"), {"train_list": "train.txt",
                                                                     "val_list": "val.txt"}, None)
            self.assertIn("validated on val.txt (2 frames)", desc)


class TestConfigBase(unittest.TestCase):
    def test_final_config_is_the_chosen_fold_recipe_on_train_and_val(self):
        # the fold recipe with the knobs kept (240x320 crops, the neck's stem
        # skips, copy-paste of the thin classes)
        cdir = os.path.join(TOOLS_DIR, "configs")
        xseq = T.load_config(os.path.join(cdir, "camvid-mita-xseq-crop240-skips-paste.json"))
        final = T.load_config(os.path.join(cdir, "camvid-mita-final.json"))
        self.assertEqual(final["model"], xseq["model"])
        changed = {k for k in set(final["train"]) | set(xseq["train"])
                   if final["train"].get(k) != xseq["train"].get(k)}
        self.assertEqual(changed, {"train_list", "holdout", "val_every"})
        self.assertEqual(final["train"]["train_list"], ["train.txt", "val.txt"])
        self.assertNotIn("base", final)

    def test_ablation_configs_change_one_knob_each(self):
        # docs/ablation.md's one-knob runs: each differs from the recipe only there
        cdir = os.path.join(TOOLS_DIR, "configs")
        xseq = T.load_config(os.path.join(cdir, "camvid-mita-xseq.json"))
        # the crop240-* runs take the 240x320 run as their base (2.5x cheaper, level with it)
        want = {"cutmix": ("", {"cutmix"}), "lovasz": ("", {"lovasz_weight"}),
                "ohem": ("", {"class_weighting", "ohem"}), "crop240": ("", {"crop"}),
                "crop240-seed1": ("-crop240", {"seed"}),
                "crop240-clip15": ("-crop240", {"class_weighting"}),
                "skips": ("", set()), "crop240-skips": ("-crop240", set()),
                "crop240-skips-seed1": ("-crop240-skips", {"seed"}),
                "crop240-skips-paste-dp01": ("-crop240-skips-paste", {"drop_path"}),
                "crop240-skips-paste-dp01-seed1": ("-crop240-skips-paste-dp01", {"seed"}),
                "crop240-skips-paste-ld075": ("-crop240-skips-paste", {"layer_decay"}),
                "crop240-skips-paste-cutmix": ("-crop240-skips-paste", {"cutmix"}),
                "crop240-skips-paste-nojitter": ("-crop240-skips-paste", {"photometric", "blur"}),
                "crop240-skips-paste-nojitter-seed1": ("-crop240-skips-paste-nojitter", {"seed"}),
                "crop240-skips-paste-noema": ("-crop240-skips-paste", {"ema"}),
                "crop240-skips-paste-noema-seed1": ("-crop240-skips-paste-noema", {"seed"}),
                "crop240-skips-paste": ("-crop240-skips", {"copy_paste"}),
                "crop240-skips-paste-seed1": ("-crop240-skips-paste", {"seed"}),
                "skips-paste": ("-skips", {"copy_paste"})}
        found = {f[len("camvid-mita-xseq-"):-len(".json")] for f in os.listdir(cdir)
                 if f.startswith("camvid-mita-xseq-") and f.endswith(".json")}
        self.assertEqual(found, set(want))
        for name, (base, keys) in want.items():
            ref = T.load_config(os.path.join(cdir, "camvid-mita-xseq%s.json" % base))
            cfg = T.load_config(os.path.join(cdir, "camvid-mita-xseq-%s.json" % name))
            model = json.loads(json.dumps(cfg["model"]))
            if "skips" in name:  # the model knob: the neck takes the stem's outputs
                self.assertEqual(model["neck"].pop("stem_skips"), 2)
            self.assertEqual(model, xseq["model"], name)
            changed = {k for k in set(cfg["train"]) | set(ref["train"])
                       if cfg["train"].get(k) != ref["train"].get(k)}
            self.assertEqual(changed, keys, name)

    def test_base_relative_path_model_override_and_loop(self):
        with tempfile.TemporaryDirectory() as d:
            os.makedirs(os.path.join(d, "sub"))
            with open(os.path.join(d, "a.json"), "w") as f:
                json.dump({"model": {"m": 1}, "train": {"lr": 1, "seed": 0}}, f)
            with open(os.path.join(d, "sub", "b.json"), "w") as f:
                json.dump({"base": "../a.json", "train": {"lr": 2}}, f)
            with open(os.path.join(d, "sub", "c.json"), "w") as f:
                json.dump({"base": "b.json", "model": {"m": 2}}, f)
            self.assertEqual(T.load_config(os.path.join(d, "sub", "b.json")),
                             {"model": {"m": 1}, "train": {"lr": 2, "seed": 0}})
            self.assertEqual(T.load_config(os.path.join(d, "sub", "c.json")),
                             {"model": {"m": 2}, "train": {"lr": 2, "seed": 0}})
            with open(os.path.join(d, "loop.json"), "w") as f:
                json.dump({"base": "loop.json"}, f)
            with self.assertRaises(ValueError):
                T.load_config(os.path.join(d, "loop.json"))


class TestClassWeights(unittest.TestCase):
    K = 3

    def labels(self):
        # image 0: 6 px class 0, 2 px class 1 ; image 1: 4 px class 0, 3 px class 2, 1 px ignore (255)
        a = torch.tensor([[0, 0, 0, 0], [0, 0, 1, 1]], dtype=torch.uint8)
        b = torch.tensor([[0, 0, 0, 0], [2, 2, 2, 255]], dtype=torch.uint8)
        return [a, b]

    def test_fixed_list_and_none(self):
        self.assertIsNone(T.class_weights({}, self.labels(), self.K))
        w = T.class_weights({"class_weights": [1, 2, 3]}, self.labels(), self.K)
        self.assertEqual(w.tolist(), [1.0, 2.0, 3.0])
        self.assertIsNone(T.class_weights({"class_weighting": "none", "class_weights": [1, 2, 3]},
                                          self.labels(), self.K))

    def test_median_freq(self):
        # f_c = pixels of c / pixels of images containing c: 10/16, 2/8, 3/8
        f = [10 / 16, 2 / 8, 3 / 8]
        med = sorted(f)[1]
        w = T.class_weights({"class_weighting": "median_freq"}, self.labels(), self.K)
        np.testing.assert_allclose(w.numpy(), [med / x for x in f], rtol=1e-6)
        wc = T.class_weights({"class_weighting": {"type": "median_freq_clip", "clip": [0.7, 1.2]}},
                             self.labels(), self.K)
        np.testing.assert_allclose(wc.numpy(), [0.7, 1.2, 1.0], rtol=1e-6)   # 0.6, 1.5, 1.0 clipped

    def test_sqrt_inv_freq(self):
        share = np.array([10, 2, 3]) / 15
        want = 1 / np.sqrt(share)
        want /= (share * want).sum()           # pixel-weighted mean 1
        w = T.class_weights({"class_weighting": "sqrt_inv_freq"}, self.labels(), self.K)
        np.testing.assert_allclose(w.numpy(), want, rtol=1e-6)
        self.assertAlmostEqual(float((torch.tensor(share) * w.double()).sum()), 1.0, places=6)

    def test_absent_class_gets_zero(self):
        w = T.class_weights({"class_weighting": "median_freq"}, self.labels(), 4)
        self.assertEqual(w[3].item(), 0.0)
        self.assertTrue(torch.isfinite(w).all())
        with self.assertRaises(ValueError):
            T.class_weights({"class_weighting": "inverse"}, self.labels(), 3)


class TestLoss(unittest.TestCase):
    def setUp(self):
        g = torch.Generator().manual_seed(0)
        self.logits = torch.randn(2, 4, 5, 6, generator=g)
        self.y = torch.randint(0, 4, (2, 5, 6), generator=g)
        self.y[0, 0, :] = 255
        self.w = torch.tensor([0.5, 1.0, 2.0, 1.5])

    def test_plain_is_weighted_ce(self):
        got = T.SegLoss(self.w, 255)(self.logits, self.y)
        want = F.cross_entropy(self.logits, self.y, weight=self.w, ignore_index=255)
        self.assertAlmostEqual(got.item(), want.item(), places=6)

    def test_ohem_keeps_hard_pixels(self):
        # naive: per-pixel CE, probability of the true class, keep p <= max(thresh, p_(min_kept))
        logp = torch.log_softmax(self.logits, 1)
        valid = self.y != 255
        yy = self.y.clamp(max=3)
        per = -logp.gather(1, yy.unsqueeze(1))[:, 0]
        p = per.neg().exp()
        for thresh, min_kept in ((0.3, 5), (0.3, 40), (1.0, 1)):
            pv = sorted(p[valid].tolist())
            t = max(thresh, pv[min_kept - 1])
            kept = valid & (p <= t)
            w = self.w[yy] * kept
            want = (per * w).sum() / w.sum()
            got = T.SegLoss(self.w, 255, ohem={"thresh": thresh, "min_kept": min_kept})(self.logits, self.y)
            self.assertAlmostEqual(got.item(), want.item(), places=5, msg=(thresh, min_kept))
            self.assertGreaterEqual(int(kept.sum()), min_kept)
        # keeping every pixel = the weighted cross-entropy
        all_kept = T.SegLoss(self.w, 255, ohem={"thresh": 1.0, "min_kept": 0})(self.logits, self.y)
        want = F.cross_entropy(self.logits, self.y, weight=self.w, ignore_index=255)
        self.assertAlmostEqual(all_kept.item(), want.item(), places=5)

    def test_lovasz_at_hard_predictions_is_one_minus_iou(self):
        # the Lovász extension equals the Jaccard loss at 0/1 points
        K = 4
        pred = torch.randint(0, K, self.y.shape, generator=torch.Generator().manual_seed(3))
        probs = F.one_hot(pred, K).permute(0, 3, 1, 2).float()
        valid = self.y != 255
        losses = []
        for c in range(K):
            gt, pr = (self.y == c) & valid, (pred == c) & valid
            if gt.sum() == 0:
                continue
            losses.append(1 - (gt & pr).sum().item() / (gt | pr).sum().item())
        got = T.lovasz_softmax(probs, self.y, 255)
        self.assertAlmostEqual(got.item(), float(np.mean(losses)), places=6)
        perfect = F.one_hot(self.y.clamp(max=3), K).permute(0, 3, 1, 2).float()
        self.assertAlmostEqual(T.lovasz_softmax(perfect, self.y, 255).item(), 0.0, places=7)

    def test_lovasz_term_adds_and_has_gradient(self):
        x = self.logits.clone().requires_grad_(True)
        base = T.SegLoss(None, 255)(x, self.y)
        both = T.SegLoss(None, 255, lovasz_weight=0.5)(x, self.y)
        lov = T.lovasz_softmax(torch.softmax(x, 1), self.y, 255)
        self.assertAlmostEqual(both.item(), base.item() + 0.5 * lov.item(), places=5)
        both.backward()
        self.assertTrue(torch.isfinite(x.grad).all() and x.grad.abs().sum() > 0)


class TestPhotometric(unittest.TestCase):
    def img(self):
        return torch.rand(3, 9, 11, generator=torch.Generator().manual_seed(1)) * 255

    def test_hue(self):
        x = self.img()
        torch.testing.assert_close(T.hue_rotate(x, 0.0), x, atol=1e-3, rtol=0)
        torch.testing.assert_close(T.hue_rotate(x, 1.0), x, atol=1e-3, rtol=0)
        torch.testing.assert_close(T.hue_rotate(T.hue_rotate(x, 0.2), -0.2), x, atol=1e-3, rtol=0)
        gray = torch.full((3, 4, 4), 100.0)
        torch.testing.assert_close(T.hue_rotate(gray, 0.3), gray, atol=1e-3, rtol=0)   # no chroma to turn
        # luma (Y) is kept, the colour changes
        y = lambda t: (torch.tensor([0.299, 0.587, 0.114]).view(3, 1, 1) * t).sum(0)
        r = T.hue_rotate(x, 0.25)
        torch.testing.assert_close(y(r), y(x), atol=1e-3, rtol=0)
        self.assertGreater((r - x).abs().max().item(), 10)

    def test_gamma_and_only_enabled_kinds(self):
        x = self.img()
        got = None
        for seed in range(20):   # find a draw that applied gamma (each kind has probability 1/2)
            rng = random.Random(seed)
            out = T.photometric(x, {"gamma": 0.5}, rng)
            if not torch.equal(out, x):
                got = out
                break
        self.assertIsNotNone(got)
        # a gamma curve keeps 0 and 255 and the pixel order
        rng = random.Random(seed)
        ends = T.photometric(torch.tensor([0.0, 255.0, 10.0, 200.0]).view(1, 1, 4).expand(3, 1, 4), {"gamma": 0.5}, rng)
        self.assertAlmostEqual(ends[0, 0, 0].item(), 0.0, places=4)
        self.assertAlmostEqual(ends[0, 0, 1].item(), 255.0, places=3)
        self.assertLess(ends[0, 0, 2].item(), ends[0, 0, 3].item())
        # nothing enabled: the image is unchanged whatever the draws
        for seed in range(5):
            self.assertTrue(torch.equal(T.photometric(x, {}, random.Random(seed)), x))

    def test_blur(self):
        const = torch.full((3, 10, 12), 77.0)
        torch.testing.assert_close(T.gaussian_blur(const, 1.3), const)
        x = self.img()
        b = T.gaussian_blur(x, 1.0)
        self.assertEqual(b.shape, x.shape)
        self.assertLess(b.std().item(), 0.7 * x.std().item())
        # interior pixel against a naive 2-D Gaussian (radius ceil(2 sigma) = 2)
        t = torch.arange(-2, 3, dtype=torch.float32)
        k1 = torch.exp(-0.5 * t ** 2)
        k2 = torch.outer(k1, k1) / k1.sum() ** 2
        want = (x[:, 2:7, 3:8] * k2).sum((1, 2))
        torch.testing.assert_close(b[:, 4, 5], want, atol=1e-3, rtol=1e-5)


class TestAugmentAndSamples(unittest.TestCase):
    MCFG = R.complete_config({
        "backbone": {"patch_size": 16, "embed_dim": 32, "depth": 4, "num_heads": 2, "pos_grid": [4, 6],
                     "out_indices": [0, 1, 2, 3]},
        "neck": {"type": "mln", "out_channels": 16},
        "decoder": {"type": "uperhead", "channels": 16, "pool_scales": [1, 2, 3, 6]},
        "classes": ["a", "b", "c"], "palette": [[0, 0, 0], [1, 1, 1], [2, 2, 2]], "ignore_index": 255,
        "input": {"short_side": None, "pad_multiple": 16}})

    def data(self):
        g = torch.Generator().manual_seed(0)
        img = (torch.rand(3, 36, 48, generator=g) * 255).to(torch.uint8)
        lab = torch.randint(0, 3, (36, 48), generator=g).to(torch.uint8)
        return img, lab

    def test_full_crop_scale_range(self):
        img, lab = self.data()
        tcfg = {"base_size": [36, 48], "scale_range": [0.5, 2.0], "crop": [36, 48],
                "photometric": {"gamma": 0.3, "hue": 0.05}, "blur": {"prob": 1.0, "sigma": [0.5, 1.0]}}
        for seed in range(8):
            x, y = T.augment(img, lab, tcfg, self.MCFG, random.Random(seed))
            self.assertEqual(tuple(x.shape), (3, 36, 48))
            self.assertEqual(tuple(y.shape), (36, 48))
            self.assertTrue(set(y.unique().tolist()) <= {0, 1, 2, 255})
            self.assertTrue(torch.isfinite(x).all())
        # scale 1 everywhere, no jitter: the crop is the image (maybe mirrored), normalised
        x, y = T.augment(img, lab, dict(tcfg, scale_range=[1.0, 1.0], photometric={}, blur=None),
                         self.MCFG, random.Random(0))
        mean = torch.tensor(self.MCFG["input"]["mean"]).view(3, 1, 1)
        std = torch.tensor(self.MCFG["input"]["std"]).view(3, 1, 1)
        ref = (img.float() - mean) / std
        self.assertTrue(torch.allclose(x, ref, atol=1e-5) or torch.allclose(x, ref.flip(-1), atol=1e-5))

    def test_samples_made_at_one_thread(self):
        # a DataLoader worker runs at one thread; the main process (workers 0)
        # must too, since PyTorch 2.x's bilinear resize differs in the last
        # bit between 1 and 2 threads
        img, lab = self.data()
        tcfg = {"base_size": [36, 48], "scale_range": [0.5, 2.0], "crop": [24, 32], "photometric": {}}
        ds = T.TrainSet([img], [lab], tcfg, self.MCFG)
        seen, real = [], T.augment

        def spy(*a, **k):
            seen.append(torch.get_num_threads())
            return real(*a, **k)
        before = torch.get_num_threads()
        torch.set_num_threads(2)
        try:
            with mock.patch.object(T, "augment", spy):
                ds[(0, 3)]
            self.assertEqual(seen, [1])
            self.assertEqual(torch.get_num_threads(), 2)   # restored
            with T.one_thread():
                a = ds[(0, 3)]
            self.assertTrue(torch.equal(a[0], ds[(0, 3)][0]))
        finally:
            torch.set_num_threads(before)

    def test_samples_do_not_depend_on_workers(self):
        img, lab = self.data()
        tcfg = {"base_size": [36, 48], "scale_range": [0.5, 2.0], "crop": [24, 32],
                "photometric": {"brightness": 0.3, "hue": 0.1}}
        ds = T.TrainSet([img, img], [lab, lab], tcfg, self.MCFG)
        rng = random.Random(5)
        epochs = [T.epoch_keys(rng, 2, 1, 2) for _ in range(2)]
        self.assertEqual(len(epochs[0]), 2)
        # the run's loader: one DataLoader, persistent workers, new keys each epoch
        sampler = T.KeySampler()
        loader = torch.utils.data.DataLoader(ds, batch_size=2, sampler=sampler, num_workers=2,
                                             persistent_workers=True, drop_last=True)
        for keys in epochs:
            sampler.keys = keys
            a = list(torch.utils.data.DataLoader(ds, batch_size=2, sampler=keys, num_workers=0))
            b = list(loader)
            self.assertEqual(len(b), 1)
            self.assertTrue(torch.equal(a[0][0], b[0][0]) and torch.equal(a[0][1], b[0][1]))
        # another seed, another sample; another epoch, other samples
        other = ds[(keys[0][0], keys[0][1] + 1)]
        self.assertFalse(torch.equal(other[0], a[0][0][0]))
        self.assertFalse(torch.equal(ds[epochs[0][0]][0], ds[epochs[1][0]][0]))


class TestCutMix(unittest.TestCase):
    def batch(self):
        x = torch.arange(4 * 3 * 10 * 14, dtype=torch.float32).reshape(4, 3, 10, 14)
        y = torch.arange(4).view(4, 1, 1).expand(4, 10, 14).clone().to(torch.uint8)
        return x, y

    def test_off_and_single_sample_are_identity(self):
        x, y = self.batch()
        for cm in (None, {}, {"prob": 0.0}):
            a, b = T.cutmix(x, y, cm, random.Random(1))
            self.assertTrue(torch.equal(a, x) and torch.equal(b, y))
        a, b = T.cutmix(x[:1], y[:1], {"prob": 1.0}, random.Random(1))
        self.assertTrue(torch.equal(a, x[:1]) and torch.equal(b, y[:1]))

    def test_boxes_move_images_and_labels_together(self):
        x, y = self.batch()
        pasted = 0
        for seed in range(20):
            a, b = T.cutmix(x, y, {"prob": 1.0, "alpha": 1.0}, random.Random(seed))
            self.assertTrue(torch.equal(x, self.batch()[0]))  # the input is not changed
            for i in range(4):
                # each label pixel names the sample its image pixel came from
                src = b[i].long()
                want = x[src, :, torch.arange(10).view(10, 1), torch.arange(14).view(1, 14)]
                self.assertTrue(torch.equal(a[i], want.permute(2, 0, 1)))
                other = src != i
                pasted += int(other.sum())
                if other.any():  # one axis-aligned box from one other sample
                    ys, xs = torch.nonzero(other, as_tuple=True)
                    box = other[ys.min():ys.max() + 1, xs.min():xs.max() + 1]
                    self.assertTrue(bool(box.all()))
                    self.assertEqual(len(torch.unique(src[other])), 1)
        self.assertGreater(pasted, 0)

    def test_reproducible(self):
        x, y = self.batch()
        a1, b1 = T.cutmix(x, y, {"prob": 0.5}, random.Random(7))
        a2, b2 = T.cutmix(x, y, {"prob": 0.5}, random.Random(7))
        self.assertTrue(torch.equal(a1, a2) and torch.equal(b1, b2))


class TestCopyPaste(unittest.TestCase):
    def batch(self):
        # sample i: image values 100 i + pixel index, labels a pattern of classes 0..4
        x = (torch.arange(3 * 6 * 8, dtype=torch.float32).reshape(1, 3, 6, 8)
             + 100.0 * torch.arange(4).view(4, 1, 1, 1))
        y = torch.stack([(torch.arange(48).reshape(6, 8) + i) % 5 for i in range(4)]).to(torch.uint8)
        return x, y

    def test_off_single_sample_and_no_classes_are_identity(self):
        x, y = self.batch()
        for cp, ids in ((None, [1]), ({}, [1]), ({"prob": 0.0}, [1]), ({"prob": 1.0}, [])):
            a, b = T.copy_paste(x, y, cp, ids, random.Random(1))
            self.assertTrue(torch.equal(a, x) and torch.equal(b, y))
        a, b = T.copy_paste(x[:1], y[:1], {"prob": 1.0}, [1], random.Random(1))
        self.assertTrue(torch.equal(a, x[:1]) and torch.equal(b, y[:1]))

    def test_pixels_of_the_classes_move_with_their_labels(self):
        x, y = self.batch()
        for seed in range(10):
            a, b = T.copy_paste(x, y, {"prob": 1.0}, [1, 3], random.Random(seed))
            self.assertTrue(torch.equal(x, self.batch()[0]))  # the input is not changed
            for i in range(4):
                # where another sample j had class 1 or 3, sample i now has j's
                # pixel and label; everywhere else its own
                src = torch.div(a[i, 0], 100, rounding_mode="floor").long()   # (h, w) sample index
                js = set(src.unique().tolist()) - {i}
                self.assertEqual(len(js), 1)                  # one other sample
                j = js.pop()
                m = (y[j] == 1) | (y[j] == 3)
                self.assertTrue(torch.equal(src == j, m))
                self.assertTrue(torch.equal(b[i][m], y[j][m]))
                self.assertTrue(torch.equal(b[i][~m], y[i][~m]))
                self.assertTrue(torch.equal(a[i][:, m], x[j][:, m]))

    def test_class_names_and_config(self):
        mcfg = {"classes": ["Sky", "Pole", "Road"]}
        self.assertEqual(T.copy_paste_ids({}, mcfg), [])
        self.assertEqual(T.copy_paste_ids({"copy_paste": {"prob": 0.5, "classes": ["Road", "Pole"]}},
                                          mcfg), [2, 1])
        with self.assertRaises(SystemExit):
            T.copy_paste_ids({"copy_paste": {"prob": 0.5, "classes": ["Pole", "Tram"]}}, mcfg)
        cfg = T.load_config(os.path.join(TOOLS_DIR, "configs", "camvid-mita-xseq-crop240-skips-paste.json"))
        self.assertEqual(T.copy_paste_ids(cfg["train"], cfg["model"]), [2, 6, 9, 10])


class TestDropPath(unittest.TestCase):
    def test_rates_rise_linearly_over_the_blocks(self):
        cfg = T.load_config(os.path.join(TOOLS_DIR, "configs", "camvid-mita-xseq-crop240-skips-paste-dp01.json"))
        self.assertEqual(cfg["train"]["drop_path"], 0.1)
        model = R.MitaSeg(cfg["model"])
        T.set_drop_path(model, 0.1)
        rates = [b.drop_path for b in model.backbone.blocks]
        self.assertEqual(len(rates), 12)
        for i, r in enumerate(rates):
            self.assertAlmostEqual(r, 0.1 * i / 11)

    def test_branch_dropped_per_sample_and_rescaled_in_training_only(self):
        blk = R.Block(8, 2, 2, 1e-6)
        blk.drop_path = 0.5
        y = torch.randn(400, 3, 8)
        blk.eval()
        self.assertTrue(torch.equal(blk._branch(y), y))
        blk.train()
        torch.manual_seed(0)
        out = blk._branch(y)
        kept = [torch.equal(out[i], y[i] * 2.0) for i in range(400)]
        dropped = [bool((out[i] == 0).all()) for i in range(400)]
        self.assertTrue(all(a != b for a, b in zip(kept, dropped)))  # each sample all or nothing
        self.assertTrue(150 < sum(kept) < 250, sum(kept))           # about half kept
        blk.drop_path = 0.0
        self.assertTrue(torch.equal(blk._branch(y), y))

    def test_block_in_eval_mode_is_the_plain_block(self):
        torch.manual_seed(1)
        blk = R.Block(8, 2, 2, 1e-6).eval()
        x = torch.randn(2, 16, 8)
        att = {"type": "full"}
        want = blk(x, (4, 4), att)
        blk.drop_path = 0.3
        self.assertTrue(torch.equal(blk(x, (4, 4), att), want))
        blk.train()
        torch.manual_seed(3)
        outs = [blk(x, (4, 4), att) for _ in range(20)]
        self.assertTrue(any(not torch.equal(o, want) for o in outs))


class TestLayerDecay(unittest.TestCase):
    def cfg(self):
        return T.load_config(os.path.join(TOOLS_DIR, "configs", "camvid-mita-xseq-crop240-skips.json"))

    def test_rates_by_depth(self):
        cfg = self.cfg()
        model = R.MitaSeg(cfg["model"])
        aux = T.AuxHead(192, 8, 11)
        groups = T.param_groups([model, aux], 0.05, 1e-3, 0.5)
        lr_of = {id(p): (g["lr"], g["weight_decay"]) for g in groups for p in g["params"]}
        named = dict(model.named_parameters())
        want = {"backbone.stem.0.conv.weight": (1e-3 * 0.5 ** 13, 0.05),
                "backbone.pos_embed": (1e-3 * 0.5 ** 13, 0.0),
                "backbone.blocks.0.attn.qkv.weight": (1e-3 * 0.5 ** 12, 0.05),
                "backbone.blocks.11.mlp.fc1.bias": (1e-3 * 0.5, 0.0),
                "neck.stem_convs.0.conv.weight": (1e-3, 0.05)}
        for name, (lr, wd) in want.items():
            self.assertAlmostEqual(lr_of[id(named[name])][0], lr, msg=name)
            self.assertEqual(lr_of[id(named[name])][1], wd, name)
        for p in aux.parameters():
            self.assertEqual(lr_of[id(p)][0], 1e-3)
        self.assertEqual(groups[0]["lr"], 1e-3)   # the logged one: the full rate
        self.assertEqual(sum(len(g["params"]) for g in groups),
                         len(list(model.parameters())) + len(list(aux.parameters())))

    def test_off_keeps_the_two_groups(self):
        # without the knob: the groups (and so checkpoints) as before it existed
        model = R.MitaSeg(self.cfg()["model"])
        aux = T.AuxHead(192, 8, 11)
        groups = T.param_groups([model, aux], 0.05)
        self.assertEqual([g["weight_decay"] for g in groups], [0.05, 0.0])
        self.assertNotIn("lr", groups[0])
        decay = [p for m in (model, aux) for n, p in m.named_parameters()
                 if not (p.ndim <= 1 or n.endswith("pos_embed"))]
        self.assertEqual([id(p) for p in groups[0]["params"]], [id(p) for p in decay])


class TestEmaScheduleBudget(unittest.TestCase):
    def test_ema(self):
        m = torch.nn.Linear(2, 1)
        with torch.no_grad():
            m.weight.fill_(0.0)
        ema = T.ModelEMA(m, 0.9)
        want = 0.0
        for n in range(1, 30):
            with torch.no_grad():
                m.weight.fill_(float(n))
            ema.update(m)
            d = min(0.9, (1 + n) / (10 + n))
            want = d * want + (1 - d) * n
            self.assertAlmostEqual(ema.module.weight[0, 0].item(), want, places=4)
        self.assertFalse(ema.module.weight.requires_grad)

    def test_warmup_cosine(self):
        f = T.WarmupCosine(10, 110, 0.01)
        self.assertAlmostEqual(f(0), 1e-3)
        self.assertAlmostEqual(f(10), 1.0)
        self.assertAlmostEqual(f(60), 0.01 + 0.99 * 0.5)
        self.assertAlmostEqual(f(110), 0.01)
        self.assertAlmostEqual(f(500), 0.01)
        f.total = 210                            # a re-plan moves the end
        self.assertAlmostEqual(f(110), 0.01 + 0.99 * 0.5)

    def test_budget_plan(self):
        b = T.BudgetPlan(100.0, 1000.0, 10_000)
        # at t=20 s, step 10, 0.5 s/step, 10 s reserve: (100 - 20 - 10)/0.5 = 140 more steps
        self.assertEqual(b.plan(1020.0, 10, 0.5, 10.0), 150)
        self.assertEqual(T.BudgetPlan(100.0, 1000.0, 60).plan(1020.0, 10, 0.5, 10.0), 60)  # --epochs caps
        self.assertEqual(b.plan(1095.0, 10, 0.5, 10.0), 11)    # over budget: one more step at least
        self.assertFalse(b.over(1080.0, 10.0))
        self.assertTrue(b.over(1091.0, 10.0))

    def test_budget_after_step(self):
        """The loops' bookkeeping: the first step's cost until a second is
        done, then seconds a step since the first; re-plans after steps 2 and
        10 (counted from the first) and at an epoch's end; stops at the plan's
        end or before a step that would cross the budget."""
        f = T.WarmupCosine(0, 10_000, 0.01)
        b = T.BudgetPlan(100.0, 1000.0, 10_000)
        reserves = []

        def reserve(cost):
            reserves.append(cost)
            return 10.0
        # step 1 ends at t=1004 (epoch began at 1000): its cost is 4 s, no plan yet
        self.assertFalse(b.after_step(1004.0, 1, 1000.0, False, reserve, f))
        self.assertEqual((b.step_cost(), f.total, reserves), (4.0, 10_000, [4.0]))
        self.assertFalse(b.after_step(1005.0, 2, 1000.0, False, reserve, f))   # 1 s a step since
        self.assertEqual(f.total, 10_000)                                      # 1 step after the first
        self.assertFalse(b.after_step(1006.0, 3, 1000.0, False, reserve, f))   # 2 after: plan
        self.assertEqual(f.total, 3 + int(100 - 6 - 10))                       # 87
        self.assertFalse(b.after_step(1007.0, 4, 1000.0, True, reserve, f))    # epoch end: plan
        self.assertEqual(f.total, 4 + 83)
        f.total = 5
        self.assertTrue(b.after_step(1008.0, 5, 1000.0, False, reserve, f))    # the plan's end
        f.total = 10_000
        # 1 s a step from t=1080, 10 s reserve: planned at step 3 to end at
        # step 11 (t=1090), but from step 10 (t=1089) one more step and the
        # reserve would reach t=1100: the budget stops it there
        b2 = T.BudgetPlan(100.0, 1000.0, 10_000)
        stops = [b2.after_step(1079.0 + k, k, 1079.0, False, reserve, f) for k in range(1, 11)]
        self.assertEqual(f.total, 11)
        self.assertEqual(stops, [False] * 9 + [True])


class TestDevicePlan(unittest.TestCase):
    """The CUDA path's choices, made by functions that take the device: the
    CUDA plan is checked without a GPU, and bf16 autocast + channels-last run
    a real training step on the CPU."""

    def test_plans(self):
        cuda, cpu = torch.device("cuda"), torch.device("cpu")
        self.assertEqual(T.precision_plan(cuda, {}), {"amp_dtype": torch.bfloat16, "channels_last": True})
        self.assertEqual(T.precision_plan(cpu, {}), {"amp_dtype": None, "channels_last": False})
        # bf16 on the CPU: channels-last too (oneDNN's faster layout), unless the config says not
        self.assertEqual(T.precision_plan(cpu, {}, "bf16"),
                         {"amp_dtype": torch.bfloat16, "channels_last": True})
        self.assertFalse(T.precision_plan(cpu, {"channels_last": False}, "bf16")["channels_last"])
        self.assertEqual(T.precision_plan(cuda, {"amp": "off"})["amp_dtype"], None)
        self.assertEqual(T.precision_plan(cpu, {}, "bf16")["amp_dtype"], torch.bfloat16)
        self.assertTrue(T.precision_plan(cpu, {"channels_last": True})["channels_last"])
        with self.assertRaises(ValueError):
            T.precision_plan(cpu, {"amp": "fp8"})
        self.assertEqual(T.loader_workers({}, cpu), 0)
        self.assertGreaterEqual(T.loader_workers({}, cuda), 1)
        self.assertLessEqual(T.loader_workers({}, cuda), 8)
        self.assertEqual(T.loader_workers({"workers": 3}, cpu), 3)
        self.assertEqual(T.pick_device("cpu"), cpu)
        if not torch.cuda.is_available():
            self.assertEqual(T.pick_device("auto"), cpu)
            with self.assertRaises(SystemExit):
                T.pick_device("cuda")

    def test_bf16_channels_last_step_on_cpu(self):
        torch.manual_seed(0)
        cpu = torch.device("cpu")
        plan = T.precision_plan(cpu, {"channels_last": True}, "bf16")
        model = R.MitaSeg(TestAugmentAndSamples.MCFG)
        aux = T.AuxHead(32, 8, 3)
        T.place([model, aux], cpu, plan)
        self.assertTrue(model.backbone.blocks[0].attn.qkv.weight.dtype == torch.float32)
        x = T.to_input(torch.randn(2, 3, 32, 48), cpu, plan)
        self.assertTrue(x.is_contiguous(memory_format=torch.channels_last))
        y = torch.randint(0, 3, (2, 32, 48))
        with T.autocast(cpu, plan):
            st = {}
            head = model(x, stages=st)
            auxl = aux(st["taps.1"])
        self.assertEqual(head.dtype, torch.bfloat16)       # autocast really ran in bf16
        head = F.interpolate(head.float(), size=(32, 48), mode="bilinear", align_corners=False)
        loss = T.SegLoss(None, 255)(head, y) + 0.4 * T.SegLoss(None, 255)(
            F.interpolate(auxl.float(), size=(32, 48), mode="bilinear", align_corners=False), y)
        loss.backward()
        self.assertTrue(math.isfinite(loss.item()))
        g = model.backbone.blocks[0].attn.qkv.weight.grad
        self.assertTrue(g is not None and torch.isfinite(g).all() and g.abs().sum() > 0)
        # CUDA's autocast runs softmax in float32 (CPU's does not): the step
        # must also run when softmax hands float32 probabilities to bf16 code
        orig = torch.softmax
        with mock.patch("torch.softmax", lambda x, dim, **kw: orig(x.float(), dim)), T.autocast(cpu, plan):
            st = {}
            head = model(x, stages=st)
        self.assertEqual(head.dtype, torch.bfloat16)
        F.cross_entropy(head.float(), y[:, ::4, ::4]).backward()   # head at 1/4 size
        miou, aacc, _ = T.evaluate(model, [torch.zeros(3, 32, 48, dtype=torch.uint8)],
                                   [torch.zeros(32, 48, dtype=torch.uint8)], model.cfg, cpu, 1, plan)
        self.assertTrue(0 <= miou <= 100 and 0 <= aacc <= 100)



class TestResumeWithEma(unittest.TestCase):
    """--resume restores the EMA weights and their update count: 2 epochs +
    resume to 3 gives bit for bit the EMA of 3 epochs in one go."""

    def test_resume_ema(self):
        from tools.tests.test_train import MODEL, TRAIN, make_dataset, run_tool
        with tempfile.TemporaryDirectory() as root:
            make_dataset(os.path.join(root, "data"), n_train=4, n_val=1)
            config = os.path.join(root, "c.json")
            with open(config, "w") as f:
                json.dump({"model": MODEL, "train": dict(TRAIN, data_root=os.path.join(root, "data"),
                                                         ema=0.9, photometric={"hue": 0.1, "gamma": 0.2})}, f)
            a, b = os.path.join(root, "a"), os.path.join(root, "b")
            run_tool("train.py", "--config", config, "--out", a, "--epochs", 3, "--no-val")
            run_tool("train.py", "--config", config, "--out", b, "--epochs", 2, "--no-val")
            run_tool("train.py", "--config", config, "--out", b, "--epochs", 3, "--no-val", "--resume")
            ca, cb = (convert.load_checkpoint(os.path.join(d, "last.pt")) for d in (a, b))
            self.assertEqual(ca["ema_updates"], 6)
            self.assertEqual(cb["ema_updates"], 6)
            for k, v in ca["ema"].items():
                self.assertTrue(torch.equal(v, cb["ema"][k]), k)
            k0 = "backbone.blocks.0.attn.qkv.weight"
            self.assertFalse(torch.equal(ca["ema"][k0], ca["model"][k0]))   # an average, not a copy


class TestTrainingSpeedPaths(unittest.TestCase):
    """mitaseg_ref's two training-only shortcuts: bf16 bilinear resizes in
    fp32, and torch.topk for the stable sort where gradients are on."""

    def test_bf16_bilinear_is_the_fp32_resize_rounded(self):
        g = torch.Generator().manual_seed(0)
        x = torch.randn(2, 5, 7, 9, generator=g)
        for cl in (False, True):
            xb = x.to(torch.bfloat16)
            if cl:
                xb = xb.contiguous(memory_format=torch.channels_last)
            for kw in ({"size": (13, 17)}, {"scale_factor": 2}, {"scale_factor": 0.5}):
                want = F.interpolate(xb.float(), mode="bilinear", align_corners=False, **kw)
                got = R.bilinear(xb, **kw)
                self.assertEqual(got.dtype, torch.bfloat16)
                self.assertTrue(torch.equal(got.float(), want.to(torch.bfloat16).float()), (cl, kw))
        # fp32 (every reference and golden run) is F.interpolate itself
        self.assertTrue(torch.equal(R.bilinear(x, size=(13, 17)),
                                    F.interpolate(x, size=(13, 17), mode="bilinear", align_corners=False)))
        # gradients reach a bf16 input as bf16
        xb = x.to(torch.bfloat16).requires_grad_(True)
        R.bilinear(xb, scale_factor=2).float().sum().backward()
        self.assertEqual(xb.grad.dtype, torch.bfloat16)
        self.assertGreater(float(xb.grad.float().abs().sum()), 0.0)

    def test_train_topk_only_where_gradients_are_on(self):
        g = torch.Generator().manual_seed(1)
        B, h, N, d, M, k = 1, 2, 12, 4, 3, 5
        q, v, L = (torch.randn(B, h, n, d, generator=g) for n in (N, N, M))
        # keys 2j and 2j + 1 equal: every probe score tied with a neighbour,
        # so the stable sort's choice (the lower position) is visible
        key = torch.randn(B, h, N // 2, d, generator=g).repeat_interleave(2, dim=2)

        def sets(grad):
            rec = {}
            with torch.set_grad_enabled(grad):
                out = R.attention_mita(q, key, v, L, k, "d", rec)
            return out, rec["topk_idx"]

        def stable_order():
            P = L @ key.transpose(-1, -2)
            return [[sorted(range(N), key=lambda j: (-float(P[0, hh, m, j]), j))[:k]
                     for m in range(M)] for hh in range(h)]

        saved = R.TRAIN_TOPK
        try:
            R.TRAIN_TOPK = False
            out0, idx0 = sets(True)
            self.assertEqual(idx0[0].tolist(), stable_order())
            R.TRAIN_TOPK = True
            out1, idx1 = sets(False)          # validation: the exact order still
            self.assertTrue(torch.equal(idx1, idx0))
            self.assertTrue(torch.equal(out1, out0))
            _, idx2 = sets(True)              # a training step: topk, same scores
            P = L @ key.transpose(-1, -2)
            for hh in range(h):
                for m in range(M):
                    got = sorted(float(P[0, hh, m, j]) for j in idx2[0, hh, m].tolist())
                    want = sorted(float(P[0, hh, m, j]) for j in idx0[0, hh, m].tolist())
                    self.assertEqual(got, want)
        finally:
            R.TRAIN_TOPK = saved

    def test_bench_train_at_a_tiny_size(self):
        """bench/bench_train.py runs both contenders and leaves the flag as it was."""
        import subprocess
        import sys
        from tools.tests.test_train import MODEL, TRAIN
        with tempfile.TemporaryDirectory() as root:
            config, out = os.path.join(root, "c.json"), os.path.join(root, "b.json")
            with open(config, "w") as f:
                json.dump({"model": MODEL, "train": TRAIN}, f)
            p = subprocess.run([sys.executable, os.path.join(TOOLS_DIR, "..", "bench", "bench_train.py"),
                                "--config", config, "--threads", "1", "--rounds", "1", "--steps", "2",
                                "--batch", "2", "--json", out],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300)
            self.assertEqual(p.returncode, 0, p.stdout)
            self.assertIn("| shortcuts |", p.stdout)
            with open(out) as f:
                rep = json.load(f)
            self.assertEqual(sorted(rep["seconds"]), ["exact", "shortcuts"])
            self.assertEqual([len(v) for v in rep["seconds"].values()], [2, 2])

    def test_train_main_sets_the_flag(self):
        saved = R.TRAIN_TOPK
        try:
            R.TRAIN_TOPK = False
            with self.assertRaises(OSError):   # stops at the missing config, after the flag
                T.main(["--config", "/nonexistent/c.json", "--out", "/nonexistent/o"])
            self.assertTrue(R.TRAIN_TOPK)
        finally:
            R.TRAIN_TOPK = saved


if __name__ == "__main__":
    unittest.main()
