"""Minimal safetensors reader/writer (numpy based, no external package).

Format: 8-byte little-endian header length, a JSON header
{name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {str: str}},
then the raw little-endian row-major tensor data. Offsets are relative to the
start of the data region. Supported dtypes: F32, F16, BF16, I32, U8 (and F64,
I64 for completeness).

BF16 has no numpy dtype: on write, pass a torch.bfloat16 tensor or a numpy
uint16 array together with dtypes={name: "BF16"}; on read, BF16 tensors are
returned widened to float32 (exact).
"""

import json
import struct

import numpy as np

_NP_OF = {
    "F64": np.dtype("<f8"),
    "F32": np.dtype("<f4"),
    "F16": np.dtype("<f2"),
    "I64": np.dtype("<i8"),
    "I32": np.dtype("<i4"),
    "U8": np.dtype("u1"),
    "BF16": np.dtype("<u2"),  # raw bits
}
_CODE_OF = {
    np.dtype("float64"): "F64",
    np.dtype("float32"): "F32",
    np.dtype("float16"): "F16",
    np.dtype("int64"): "I64",
    np.dtype("int32"): "I32",
    np.dtype("uint8"): "U8",
}

MAX_HEADER = 100 * 1024 * 1024


def _to_numpy(value, code=None):
    """Returns (numpy array in the stored byte layout, dtype code)."""
    try:
        import torch
        if isinstance(value, torch.Tensor):
            t = value.detach().cpu().contiguous()
            if t.dtype == torch.bfloat16:
                return t.view(torch.int16).numpy().view(np.uint16), "BF16"
            value = t.numpy()
    except ImportError:  # pragma: no cover
        pass
    arr = np.ascontiguousarray(value)
    if code == "BF16":
        if arr.dtype == np.uint16:
            return arr, "BF16"
        # round-to-nearest-even float32 -> bfloat16 bits
        bits = arr.astype("<f4").view("<u4")
        rounded = bits + 0x7FFF + ((bits >> 16) & 1)
        return (rounded >> 16).astype("<u2"), "BF16"
    if code is not None:
        arr = arr.astype(_NP_OF[code])
        return arr, code
    if arr.dtype not in _CODE_OF:
        raise TypeError("unsupported dtype %s" % arr.dtype)
    return arr.astype(arr.dtype.newbyteorder("<")), _CODE_OF[arr.dtype]


def save(path, tensors, metadata=None, dtypes=None):
    """Writes tensors (dict name -> numpy array or torch tensor) to path.

    metadata: dict str -> str stored as __metadata__. dtypes: optional dict
    name -> dtype code to convert to on write (e.g. "F16", "BF16").
    Tensors are laid out by descending element size, then name, with no
    gaps, so each starts aligned to its element size; the header is
    space-padded so the data region starts 8-byte aligned, as the reference
    implementation does.
    """
    dtypes = dtypes or {}
    header = {}
    blobs = []
    offset = 0
    arrays = {name: _to_numpy(tensors[name], dtypes.get(name)) for name in tensors}
    for name in sorted(arrays, key=lambda k: (-arrays[k][0].dtype.itemsize, k)):
        arr, code = arrays[name]
        raw = arr.tobytes()
        header[name] = {"dtype": code, "shape": list(arr.shape),
                        "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    if metadata:
        for k, v in metadata.items():
            if not isinstance(k, str) or not isinstance(v, str):
                raise TypeError("__metadata__ must map str to str")
        header["__metadata__"] = dict(metadata)
    hjson = json.dumps(header, separators=(",", ":")).encode("utf-8")
    hjson += b" " * ((8 - len(hjson) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hjson)))
        f.write(hjson)
        for raw in blobs:
            f.write(raw)


def load(path, bf16_as_float32=True):
    """Reads path; returns (dict name -> numpy array, metadata dict).

    Validates what a careful loader must: header length within the file,
    dtype x shape equal to the byte range, ranges inside the data region and
    not overlapping.
    """
    with open(path, "rb") as f:
        data = f.read()
    if len(data) < 8:
        raise ValueError("%s: file too short (%d bytes)" % (path, len(data)))
    (hlen,) = struct.unpack("<Q", data[:8])
    if hlen > MAX_HEADER or 8 + hlen > len(data):
        raise ValueError("%s: header length %d past end of file (%d bytes)"
                         % (path, hlen, len(data)))
    header = json.loads(data[8:8 + hlen].decode("utf-8"))
    meta = header.pop("__metadata__", {}) or {}
    body = memoryview(data)[8 + hlen:]
    out = {}
    ranges = []
    for name, info in header.items():
        code = info["dtype"]
        if code not in _NP_OF:
            raise ValueError("%s: tensor %s has unsupported dtype %s" % (path, name, code))
        shape = tuple(int(s) for s in info["shape"])
        b, e = (int(x) for x in info["data_offsets"])
        n = int(np.prod(shape, dtype=np.int64)) if shape else 1
        if not (0 <= b <= e <= len(body)):
            raise ValueError("%s: tensor %s byte range [%d, %d) outside data (%d bytes)"
                             % (path, name, b, e, len(body)))
        if e - b != n * _NP_OF[code].itemsize:
            raise ValueError("%s: tensor %s: %s x %s is not %d bytes"
                             % (path, name, code, list(shape), e - b))
        ranges.append((b, e, name))
        arr = np.frombuffer(body[b:e], dtype=_NP_OF[code]).reshape(shape).copy()
        if code == "BF16" and bf16_as_float32:
            arr = (arr.astype(np.uint32) << 16).view(np.float32)
        out[name] = arr
    ranges.sort()
    for (b0, e0, n0), (b1, e1, n1) in zip(ranges, ranges[1:]):
        if b1 < e0:
            raise ValueError("%s: tensors %s and %s overlap" % (path, n0, n1))
    return out, meta


def dtype_codes(path):
    """Returns {name: dtype code} from the header of path (no data read)."""
    with open(path, "rb") as f:
        (hlen,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(hlen).decode("utf-8"))
    header.pop("__metadata__", None)
    return {k: v["dtype"] for k, v in header.items()}
