#!/usr/bin/env python3
"""Writes a random-weight UperNet model file of a standard size for the
benchmarks (speed does not depend on the weights).

  python3 bench/make_bench_model.py deit-tiny|deit-small SIZE OUT.safetensors
"""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tools"))

# (embed_dim, heads, neck channels, head channels): DeiT-Tiny and DeiT-Small
# backbones, 12 blocks, patch 16, with an mln neck and a light UperHead.
SIZES = {"deit-tiny": (192, 3, 192, 128), "deit-small": (384, 6, 384, 256)}


def bench_config(name, size):
    dim, heads, neck, head = SIZES[name]
    return {
        "backbone": {"patch_size": 16, "embed_dim": dim, "depth": 12, "num_heads": heads,
                     "pos_grid": [size // 16, size // 16], "out_indices": [2, 5, 8, 11],
                     "attention": {"type": "mita", "landmarks": [7, 7], "topk": 49,
                                   "shared_scale": "d"}},
        "neck": {"type": "mln", "out_channels": neck},
        "decoder": {"type": "uperhead", "channels": head, "pool_scales": [1, 2, 3, 6]},
        "classes": ["c%d" % i for i in range(11)],
        "palette": [[i * 20, i * 10, 255 - i * 20] for i in range(11)],
        "ignore_index": None,
        "input": {"short_side": None, "pad_multiple": 16},
        "provenance": "random %s-sized weights for benchmarking" % name,
    }


def write_bench_model(name, size, path):
    import torch
    import mitaseg_ref
    torch.manual_seed(0)
    model = mitaseg_ref.MitaSeg(bench_config(name, size)).eval()
    mitaseg_ref.save_model(model, path)
    return model


if __name__ == "__main__":
    if len(sys.argv) != 4 or sys.argv[1] not in SIZES:
        sys.exit(__doc__)
    write_bench_model(sys.argv[1], int(sys.argv[2]), sys.argv[3])
