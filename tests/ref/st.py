"""Minimal safetensors reading and writing with numpy, written from the
format description (8-byte little-endian header length, JSON header, raw
little-endian tensor bytes). Independent of freshet's C implementation, so
tests can check one against the other."""
import json
import struct

import numpy as np

DTYPES = {"F32": np.float32, "F64": np.float64, "I64": np.int64, "I32": np.int32}


def write(path, tensors, metadata=None):
    """tensors: list of (name, float32 array) in file order."""
    header, offset, blobs = {}, 0, []
    if metadata:
        header["__metadata__"] = dict(metadata)
    for name, arr in tensors:
        arr = np.ascontiguousarray(arr, dtype="<f4")
        header[name] = {"dtype": "F32", "shape": list(arr.shape),
                        "data_offsets": [offset, offset + arr.nbytes]}
        offset += arr.nbytes
        blobs.append(arr.tobytes())
    text = json.dumps(header).encode()
    text += b" " * ((8 - (8 + len(text)) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for b in blobs:
            f.write(b)


def read(path):
    """Returns ({name: array}, metadata) and checks the layout rules."""
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    assert (8 + n) % 8 == 0, "header not padded to a multiple of 8"
    assert data[8:9] == b"{", "header does not start with '{'"
    header = json.loads(data[8:8 + n])
    meta = header.pop("__metadata__", {})
    body = data[8 + n:]
    spans = sorted((v["data_offsets"][0], v["data_offsets"][1], k) for k, v in header.items())
    pos = 0
    out = {}
    for begin, end, name in spans:
        assert begin == pos, f"hole or overlap before {name}"
        info = header[name]
        arr = np.frombuffer(body[begin:end], dtype=DTYPES[info["dtype"]]).reshape(info["shape"])
        out[name] = arr
        pos = end
    assert pos == len(body), "file size does not match the header"
    return out, meta
