"""The same prediction as freshet serve's POST /v2/models/{m}/infer, done by
PyTorch in-process: the request's JSON parsed, the 784-256-10 model's
forward pass (ReLU, softmax) on one thread, the answer's JSON written.
Prints the microseconds per request, median of ROUNDS rounds, for the
forward pass alone and with the JSON around it.

With ANSWER.json (freshet's answer to BODY.json) it first checks that the
probabilities agree to 1e-5 and prints the largest difference.

usage: /usr/bin/python3 bench/torch_infer.py WEIGHTS.safetensors BODY.json [ROUNDS] [N] [ANSWER.json]
(Debian's python3-torch and python3-numpy; bench/serve.sh runs it.)
"""
import json
import statistics
import struct
import sys
import time

import numpy as np
import torch


def load(path):
    """The model's tensors from a safetensors file (F32 only)."""
    with open(path, "rb") as f:
        raw = f.read()
    (hlen,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + hlen])
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        a, b = t["data_offsets"]
        out[name] = torch.from_numpy(
            np.frombuffer(raw, dtype="<f4", count=(b - a) // 4, offset=8 + hlen + a).reshape(t["shape"]).copy()
        )
    return out


def main():
    weights, body_path = sys.argv[1], sys.argv[2]
    rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 3
    n = int(sys.argv[4]) if len(sys.argv) > 4 else 2000
    torch.set_num_threads(1)
    t = load(weights)
    layers = sorted({k.split(".")[1] for k in t}, key=int)
    mods = []
    for i, l in enumerate(layers):
        w = t[f"layers.{l}.weight"]
        lin = torch.nn.Linear(w.shape[1], w.shape[0])
        lin.weight.data.copy_(w)
        lin.bias.data.copy_(t[f"layers.{l}.bias"])
        mods.append(lin)
        if i < len(layers) - 1:
            mods.append(torch.nn.ReLU())
    mods.append(torch.nn.Softmax(dim=1))
    model = torch.nn.Sequential(*mods).eval()
    with open(body_path, "rb") as f:
        body = f.read()

    def forward_only(x):
        with torch.no_grad():
            return model(x)

    def request(raw):
        req = json.loads(raw)
        inp = req["inputs"][0]
        x = torch.tensor(inp["data"], dtype=torch.float32).reshape(inp["shape"])
        with torch.no_grad():
            p = model(x)
        return json.dumps(
            {
                "model_name": "bench",
                "outputs": [
                    {"name": "probabilities", "datatype": "FP32", "shape": list(p.shape), "data": p.flatten().tolist()},
                    {"name": "argmax", "datatype": "INT64", "shape": [p.shape[0]], "data": p.argmax(dim=1).tolist()},
                ],
            }
        )

    req = json.loads(body)["inputs"][0]
    x = torch.tensor(req["data"], dtype=torch.float32).reshape(req["shape"])
    if len(sys.argv) > 5:
        with open(sys.argv[5]) as f:
            ans = json.load(f)
        got = next(o for o in ans["outputs"] if o["name"] == "probabilities")
        diff = (torch.tensor(got["data"]).reshape(got["shape"]) - forward_only(x)).abs().max().item()
        print(f"freshet vs torch: largest probability difference {diff:.2e}")
        if diff > 1e-5:
            sys.exit("torch_infer.py: freshet's probabilities differ from PyTorch's")
    fw, full = [], []
    for _ in range(rounds):
        for _ in range(200):
            forward_only(x)
        t0 = time.perf_counter()
        for _ in range(n):
            forward_only(x)
        fw.append((time.perf_counter() - t0) / n * 1e6)
        t0 = time.perf_counter()
        for _ in range(n):
            request(body)
        full.append((time.perf_counter() - t0) / n * 1e6)
    print(
        f"torch {torch.__version__} forward_us {statistics.median(fw):.1f} {min(fw):.1f} {max(fw):.1f} "
        f"request_us {statistics.median(full):.1f} {min(full):.1f} {max(full):.1f}"
    )


if __name__ == "__main__":
    main()
