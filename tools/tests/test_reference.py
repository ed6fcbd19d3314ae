"""Properties of the PyTorch reference model (tools/mitaseg_ref.py) checked
against independent renderings of docs/mita-spec.md and docs/model-format.md."""

import math
import os
import tempfile
import unittest

import numpy as np
import torch

from tools.tests import TOOLS_DIR  # noqa: F401  (puts tools/ on sys.path)
import mitaseg_ref as R
import safetensors_io


# ---------------------------------------------------------------- naive MiTA

def naive_landmarks(q_tok, grid, landmarks, h):
    """Spec 2.1 written out: window [floor(i*S/G), ceil((i+1)*S/G)) per axis,
    G clamped to the grid. q_tok (N, C) -> L (h, M, d)."""
    Hp, Wp = grid
    N, C = q_tok.shape
    gh, gw = min(landmarks[0], Hp), min(landmarks[1], Wp)
    qmap = q_tok.reshape(Hp, Wp, C)
    rows = []
    for i in range(gh):
        r0, r1 = (i * Hp) // gh, -((-(i + 1) * Hp) // gh)
        for j in range(gw):
            c0, c1 = (j * Wp) // gw, -((-(j + 1) * Wp) // gw)
            rows.append(qmap[r0:r1, c0:c1].reshape(-1, C).mean(0))
    L = torch.stack(rows)                                  # (M, C)
    return L.reshape(gh * gw, h, C // h).transpose(0, 1)   # (h, M, d)


def naive_mita(q, k, v, L, topk, shared_scale):
    """Spec 2.2-2.5, one head and one query at a time. q,k,v (h,N,d); L (h,M,d)."""
    h, N, d = q.shape
    M = L.shape[1]
    kk = min(topk, N)
    s = 1.0 / math.sqrt(d)
    s_sh = s if shared_scale == "d" else 1.0
    out = torch.zeros_like(q)
    for hh in range(h):
        P = L[hh] @ k[hh].T                                         # (M, N)
        # k largest P[m, :], ties to the lower position
        sets = [sorted(range(N), key=lambda n: (-P[m, n].item(), n))[:kk] for m in range(M)]
        Sv = torch.stack([torch.softmax(P[m] * s, 0) @ v[hh] for m in range(M)])
        for n in range(N):
            Rn = [float(q[hh, n] @ L[hh, m]) for m in range(M)]
            e = max(range(M), key=lambda m: (Rn[m], -m))            # ties to the lower m
            logits = [Rn[m] * s * s_sh for m in range(M)]
            logits += [float(q[hh, n] @ k[hh, j]) * s for j in sets[e]]
            p = torch.softmax(torch.tensor(logits, dtype=q.dtype), 0)
            o = sum(p[m] * Sv[m] for m in range(M))
            o = o + sum(p[M + t] * v[hh, j] for t, j in enumerate(sets[e]))
            out[hh, n] = o
    return out


def ref_mita(q_tok, k_tok, v_tok, grid, landmarks, topk, shared_scale, h):
    """The reference's attention_mita on token-major (N, C) inputs -> (h, N, d)."""
    N, C = q_tok.shape
    heads = lambda t: t.reshape(1, N, h, C // h).transpose(1, 2)    # (1, h, N, d)
    L, _ = R.mita_landmarks(q_tok.unsqueeze(0), grid, landmarks, h)
    return R.attention_mita(heads(q_tok), heads(k_tok), heads(v_tok), L, topk, shared_scale)[0]


class TestMitaAttention(unittest.TestCase):
    # Both sides run in float64 with the same operations up to summation order:
    # 1e-10 is ~1e6 ulp of the O(1) outputs, far below any indexing error (O(0.1)).
    TOL = 1e-10

    def check(self, grid, landmarks, topk, shared_scale, h=2, d=4, seed=0, ints=False):
        g = torch.Generator().manual_seed(seed)
        N, C = grid[0] * grid[1], h * d
        if ints:   # small integers: many exact ties in P and R
            q, k, v = (torch.randint(-1, 2, (N, C), generator=g).double() for _ in range(3))
        else:
            q, k, v = (torch.randn(N, C, generator=g, dtype=torch.float64) for _ in range(3))
        got = ref_mita(q, k, v, grid, landmarks, topk, shared_scale, h)
        heads = lambda t: t.reshape(N, h, d).transpose(0, 1)
        L = naive_landmarks(q, grid, landmarks, h)
        want = naive_mita(heads(q), heads(k), heads(v), L, topk, shared_scale)
        self.assertEqual(tuple(got.shape), (h, N, d))
        self.assertLess((got - want).abs().max().item(), self.TOL)

    def test_landmarks_match_spec_windows(self):
        # overlapping windows: 5 rows into 3, 7 columns into 3
        q = torch.randn(35, 8, dtype=torch.float64)
        L, eff = R.mita_landmarks(q.unsqueeze(0), (5, 7), (3, 3), 2)
        self.assertEqual(tuple(eff), (3, 3))
        self.assertLess((L[0] - naive_landmarks(q, (5, 7), (3, 3), 2)).abs().max().item(), 1e-12)

    def test_mita_matches_naive_loop(self):
        self.check((5, 6), (3, 3), 7, "d", seed=1)
        self.check((5, 6), (2, 4), 5, "sqrt_d", seed=2)

    def test_mita_topk_at_least_n(self):
        self.check((3, 4), (2, 2), 12, "d", seed=3)     # k = N
        self.check((3, 4), (2, 2), 100, "sqrt_d", seed=4)   # k > N: clamped

    def test_mita_grid_smaller_than_landmarks(self):
        self.check((2, 3), (7, 7), 4, "d", seed=5)       # landmarks clamp to 2x3
        self.check((1, 5), (3, 3), 3, "sqrt_d", seed=6)  # one row

    def test_mita_ties_go_to_lower_index(self):
        for seed in range(3):
            self.check((4, 4), (2, 2), 5, "d", seed=seed, ints=True)

    def test_k_equals_n_one_landmark_mixes_full_attention(self):
        """With M = 1 and k = N every query routes to the one expert, whose set
        is all N keys, so the joint softmax splits into
            out = w Sv + (1 - w) full,   w = sigmoid(a - logsumexp_j b_j),
        with a = (q . l) s s_sh, b_j = q . k_j s, l = mean of the queries and
        Sv = softmax(l K^T s) V: full attention plus one extra "summary" key."""
        g = torch.Generator().manual_seed(7)
        h, d, grid = 2, 8, (4, 5)
        N, C = 20, 16
        q, k, v = (torch.randn(1, h, N, d, generator=g, dtype=torch.float64) for _ in range(3))
        for shared_scale, s_sh in (("d", d ** -0.5), ("sqrt_d", 1.0)):
            q_tok = q.transpose(1, 2).reshape(1, N, C)
            L, eff = R.mita_landmarks(q_tok, grid, (1, 1), h)
            self.assertEqual(tuple(eff), (1, 1))
            got = R.attention_mita(q, k, v, L, N, shared_scale)
            s = d ** -0.5
            lm = q.mean(2, keepdim=True)                                   # (1, h, 1, d)
            self.assertLess((L - lm).abs().max().item(), 1e-12)
            b = q @ k.transpose(-1, -2) * s                                # (1, h, N, N)
            a = q @ lm.transpose(-1, -2) * s * s_sh                        # (1, h, N, 1)
            w = torch.sigmoid(a - torch.logsumexp(b, -1, keepdim=True))
            Sv = torch.softmax(lm @ k.transpose(-1, -2) * s, -1) @ v        # (1, h, 1, d)
            want = w * Sv + (1 - w) * R.attention_full(q, k, v)
            self.assertLess((got - want).abs().max().item(), self.TOL)


class TestClassToken(unittest.TestCase):
    """mita-spec 1 and 2.7: the class token is token 0 of the sequence, a key
    and query like any other; the landmarks pool the grid only; records number
    it N, after the grid."""

    def test_mita_with_class_token_matches_naive_loop(self):
        g = torch.Generator().manual_seed(11)
        h, d, grid, topk = 2, 4, (4, 5), 6
        N, C = 20, 8
        q, k, v = (torch.randn(N + 1, C, generator=g, dtype=torch.float64) for _ in range(3))
        heads = lambda t: t.reshape(-1, h, d).transpose(0, 1)
        L = naive_landmarks(q[1:], grid, (2, 2), h)          # grid queries only
        want = naive_mita(heads(q), heads(k), heads(v), L, topk, "d")
        rec = {}
        got = R.attention_mita(heads(q)[None], heads(k)[None], heads(v)[None], L[None], topk,
                               "d", rec, ncls=1)[0]
        self.assertLess((got - want).abs().max().item(), 1e-10)
        # records: sequence position 0 is reported as N, position j >= 1 as j - 1
        P = L @ heads(k).transpose(-1, -2)                    # (h, M, 1 + N)
        seq_idx = torch.sort(P, dim=-1, descending=True, stable=True).indices[..., :topk]
        self.assertTrue(torch.equal(rec["topk_idx"][0], (seq_idx - 1) % (N + 1)))
        Rm = heads(q) @ L.transpose(-1, -2)                   # (h, 1 + N, M)
        e = R.first_argmax(Rm, -1)
        self.assertTrue(torch.equal(rec["route"][0], torch.cat([e[:, 1:], e[:, :1]], 1)))

    def test_class_token_wins_exact_ties(self):
        # a class token whose key equals grid token 3's: the probe ties; the
        # lower sequence index (the class token) is picked, reported as N
        h, d, N = 1, 2, 4
        k = torch.tensor([[0.0, 1.0], [0.1, 0.0], [0.2, 0.0], [0.3, 0.0], [0.0, 1.0]],
                         dtype=torch.float64)          # rows: class, grid 0..3
        k[0] = k[4]
        q = torch.ones(N + 1, d, dtype=torch.float64)
        L = torch.tensor([[[[0.0, 1.0]]]], dtype=torch.float64)   # one landmark
        rec = {}
        R.attention_mita(q[None, None], k[None, None], k[None, None], L, 1, "d", rec, ncls=1)
        self.assertEqual(rec["topk_idx"][0, 0, 0].tolist(), [N])

    def test_pos_embed_class_row_not_resized_and_taps_drop_it(self):
        cfg = tiny_config()
        cfg["backbone"] = dict(cfg["backbone"], cls_token=True)
        m = R.MitaSeg(cfg).double().eval()
        with torch.no_grad():
            m.backbone.pos_embed.normal_()
            m.backbone.cls_token.normal_()
        pos = m.backbone.pos_embed
        self.assertEqual(tuple(pos.shape), (1, 1 + 24, 32))
        r = R.resize_pos_embed(pos, (4, 6), (3, 5), ncls=1)
        self.assertEqual(tuple(r.shape), (1, 1 + 15, 32))
        self.assertTrue(torch.equal(r[:, 0], pos[:, 0]))
        self.assertTrue(torch.equal(r[:, 1:], R.resize_pos_embed(pos[:, 1:], (4, 6), (3, 5))))
        st = {}
        with torch.no_grad():
            m(torch.randn(1, 3, 48, 80, dtype=torch.float64), attn={"type": "full"}, stages=st)
        self.assertEqual(tuple(st["embed"].shape), (1, 16, 32))
        self.assertEqual(tuple(st["taps.0"].shape), (1, 32, 3, 5))
        self.assertTrue(torch.equal(st["taps.0"], st["blocks.0"][:, 1:].transpose(1, 2)
                                    .reshape(1, 32, 3, 5)))


# ---------------------------------------------------------------- pre/post

def tiny_config(**over):
    cfg = {
        "backbone": {"patch_size": 16, "embed_dim": 32, "depth": 4, "num_heads": 2,
                     "pos_grid": [4, 6], "out_indices": [0, 1, 2, 3],
                     "attention": {"type": "mita", "landmarks": [2, 2], "topk": 8}},
        "neck": {"type": "mln", "out_channels": 16},
        "decoder": {"channels": 16},
        "classes": ["a", "b", "c"],
        "input": {"short_side": 64},
    }
    cfg.update(over)
    return cfg


class TestPrePost(unittest.TestCase):
    def test_preprocess_resize_and_pad(self):
        cfg = R.complete_config(tiny_config())
        colour = np.array([200, 100, 50], dtype=np.uint8)
        img = np.tile(colour, (100, 130, 1))              # (H=100, W=130, 3)
        x, (rh, rw) = R.preprocess(img, cfg)
        # short side 100 -> 64: scale 0.64, W = floor(130 * 0.64 + 0.5) = 83
        self.assertEqual((rh, rw), (64, 83))
        self.assertEqual(tuple(x.shape), (1, 3, 64, 96))   # 83 padded up to 6 * 16
        want = (torch.tensor(colour, dtype=torch.float32) - torch.tensor(cfg["input"]["mean"])) \
            / torch.tensor(cfg["input"]["std"])
        # a constant image stays constant through a bilinear resize: only
        # float rounding of the interpolation weights (~1e-5 of 255) remains
        self.assertLess((x[0, :, :, :83] - want.view(3, 1, 1)).abs().max().item(), 1e-4)
        self.assertEqual(x[0, :, :, 83:].abs().max().item(), 0.0)   # zero padding after normalising

    def test_preprocess_native_size(self):
        cfg = R.complete_config(tiny_config(input={"short_side": None}))
        x, rs = R.preprocess(np.zeros((33, 50, 3), np.uint8), cfg)
        self.assertEqual(tuple(rs), (33, 50))
        self.assertEqual(tuple(x.shape), (1, 3, 48, 64))

    def test_postprocess_crops_padding_before_resizing(self):
        # padded 32x48, working 32x40: class 1 wins only in the padding,
        # which must be cropped away, not squeezed into the image.
        logits = torch.zeros(1, 2, 32, 48)
        logits[0, 0, :, :40] = 1.0
        logits[0, 1, :, 40:] = 5.0
        full, mask = R.postprocess(logits, (32, 48), (32, 40), (64, 80))
        self.assertEqual(tuple(full.shape), (1, 2, 64, 80))
        self.assertEqual(tuple(mask.shape), (1, 64, 80))
        self.assertEqual(mask.dtype, torch.uint8)
        self.assertEqual(int(mask.max()), 0)

    def test_postprocess_upsamples_head_and_breaks_ties_low(self):
        head = torch.zeros(1, 3, 2, 3)         # all classes tie -> class 0
        head[0, 2, :, 2] = 1.0                 # right third: class 2
        _, mask = R.postprocess(head, (32, 48), (32, 48), (32, 48))
        self.assertEqual(int(mask[0, :, :16].max()), 0)
        self.assertEqual(int(mask[0, :, 40:].min()), 2)

    def test_segment_shapes(self):
        torch.manual_seed(0)
        model = R.MitaSeg(tiny_config()).eval()
        img = np.random.default_rng(0).integers(0, 256, (70, 100, 3), dtype=np.uint8)
        with torch.no_grad():
            mask, logits = R.segment(model, img)
        self.assertEqual(tuple(mask.shape), (70, 100))
        self.assertEqual(tuple(logits.shape), (3, 70, 100))

    def test_segment_tta_flip(self):
        """tta="flip": the mean of the image's logits and the mirror image's
        mirrored back; the mask their argmax; stages keep the unflipped pass."""
        torch.manual_seed(0)
        model = R.MitaSeg(tiny_config()).double().eval()
        img = np.random.default_rng(1).integers(0, 256, (70, 100, 3), dtype=np.uint8)
        with torch.no_grad():
            _, plain = R.segment(model, img)
            _, mirrored = R.segment(model, np.ascontiguousarray(img[:, ::-1]))
            st = {}
            mask, tta = R.segment(model, img, stages=st, tta="flip")
            _, tta_m = R.segment(model, np.ascontiguousarray(img[:, ::-1]), tta="flip")
        torch.testing.assert_close(tta, 0.5 * (plain + mirrored.flip(-1)), rtol=0, atol=1e-12)
        torch.testing.assert_close(tta_m, tta.flip(-1), rtol=0, atol=1e-12)   # flip-equivariant
        self.assertTrue(torch.equal(mask.long(), tta.argmax(0)))
        self.assertGreater((tta - plain).abs().max().item(), 1e-3)            # not a no-op
        self.assertTrue(torch.equal(st["logits"][0], tta))
        self.assertIn("layers.0.route", st)
        with self.assertRaises(ValueError):
            R.segment(model, img, tta="rot90")


# ---------------------------------------------------------------- model file

def randomised_model(cfg, seed=0):
    """A model whose every tensor (BN statistics included) is random."""
    torch.manual_seed(seed)
    model = R.MitaSeg(cfg)
    with torch.no_grad():
        for name, t in model.state_dict().items():
            if name.endswith("num_batches_tracked"):
                continue
            if name.endswith("running_var"):
                t.copy_(torch.rand_like(t) + 0.5)
            else:
                t.copy_(torch.randn_like(t) * 0.3)
    return model.eval()


class TestModelFile(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.cfg = tiny_config()
        self.model = randomised_model(self.cfg)

    def tearDown(self):
        self.tmp.cleanup()

    def path(self, name):
        return os.path.join(self.tmp.name, name)

    def test_f32_round_trip_exact(self):
        R.save_model(self.model, self.path("m.safetensors"), provenance="unit test")
        back = R.load_model(self.path("m.safetensors"))
        self.assertEqual(back.cfg, R.complete_config(dict(self.cfg, provenance="unit test")))
        a, b = R.model_tensors(self.model), R.model_tensors(back)
        self.assertEqual(sorted(a), sorted(b))
        for k in a:
            self.assertTrue(torch.equal(a[k], b[k]), k)
        self.assertEqual(back.extra_tensors, [])
        x = torch.randn(1, 3, 64, 96)
        with torch.no_grad():
            self.assertTrue(torch.equal(self.model(x), back(x)))
        codes = safetensors_io.dtype_codes(self.path("m.safetensors"))
        self.assertEqual(set(codes.values()), {"F32"})

    def test_f16_and_bf16_round_trip_rounding(self):
        a = R.model_tensors(self.model)
        for code, tdt, rel in (("F16", torch.float16, 2.0 ** -11), ("BF16", torch.bfloat16, 2.0 ** -8)):
            p = self.path("m-%s.safetensors" % code)
            R.save_model(self.model, p, dtype=code)
            self.assertEqual(set(safetensors_io.dtype_codes(p).values()), {code})
            b = R.model_tensors(R.load_model(p))
            for k in a:
                # round to nearest even in both writers: exactly torch's cast
                self.assertTrue(torch.equal(b[k], a[k].to(tdt).float()), k)
                # and within half an ulp (relative 2^-11 for F16, 2^-8 for BF16)
                # for values in F16's normal range (|w| > 2^-14)
                big = a[k].abs() > 2.0 ** -14
                self.assertTrue(((b[k] - a[k]).abs()[big] <= rel * a[k].abs()[big]).all(), k)

    def test_load_rejects_missing_tensor(self):
        p = self.path("cut.safetensors")
        R.save_model(self.model, p)
        tensors, meta = safetensors_io.load(p)
        del tensors["decode_head.conv_seg.bias"]
        safetensors_io.save(p, tensors, meta)
        with self.assertRaises(ValueError) as cm:
            R.load_model(p)
        self.assertIn(p, str(cm.exception))
        self.assertIn("decode_head.conv_seg.bias", str(cm.exception))


if __name__ == "__main__":
    unittest.main()
