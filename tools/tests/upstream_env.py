"""Makes mmsegmentation importable on mmcv-lite (tools/tests/test_upstream.py).

mmcv-lite ships no compiled ops (mmcv.ops), but mmsegmentation imports some
of them at module level in files the ViT-UperNet never runs (point_head,
mask_classification, ...). This puts a stand-in mmcv.ops in sys.modules whose
every name raises when used, so an accidental use fails loudly instead of
computing anything. Import it before mmseg."""

import sys
import types


class _MissingOp:
    def __init__(self, name):
        self.name = name

    def __call__(self, *args, **kwargs):
        raise RuntimeError("mmcv.ops.%s: a compiled op, not in mmcv-lite" % self.name)


def _getattr(name):
    if name.startswith("__"):
        raise AttributeError(name)
    return _MissingOp(name)


if "mmcv.ops" not in sys.modules:
    _ops = types.ModuleType("mmcv.ops")
    _ops.__getattr__ = _getattr
    sys.modules["mmcv.ops"] = _ops
    import mmcv  # noqa: E402

    mmcv.ops = _ops
