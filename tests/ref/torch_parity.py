"""freshet fit --init --no-shuffle against PyTorch doing the same steps.

For every loss x optimizer: random data (CSV), random initial weights
(safetensors), a final partial batch; freshet's final weights must equal
PyTorch's within 1e-4 relative, and freshet eval's loss must equal PyTorch's
loss of its own final weights.

usage: torch_parity.py FRESHET WORKDIR
"""
import json
import os
import subprocess
import sys

import numpy as np
import torch
import torch.nn.functional as F

import st

torch.set_num_threads(1)
freshet, work = sys.argv[1], sys.argv[2]
os.makedirs(work, exist_ok=True)

N, D, H = 203, 13, 9          # 203 = 12 batches of 16 and a partial batch of 11
BATCH, EPOCHS, LR, MU = 16, 3, 0.05, 0.9
failures = 0


def make_data(loss, rng):
    x = rng.uniform(-1, 1, size=(N, D)).astype(np.float32)
    if loss == "softmax":
        y = rng.integers(0, 4, size=N).astype(np.float32)
    elif loss == "logistic":
        y = rng.integers(0, 2, size=N).astype(np.float32)
    else:
        y = rng.normal(size=N).astype(np.float32)
    return x, y


def torch_fit(loss, optim, params, x, y):
    ps = [torch.tensor(p, requires_grad=True) for p in params]
    if optim == "sgd":
        opt = torch.optim.SGD(ps, lr=LR)
    elif optim == "momentum":
        opt = torch.optim.SGD(ps, lr=LR, momentum=MU)
    else:
        opt = torch.optim.Adagrad(ps, lr=LR, eps=1e-10)
    X, Y = torch.tensor(x), torch.tensor(y)
    for _ in range(EPOCHS):
        for s in range(0, N, BATCH):
            xb, yb = X[s:s + BATCH], Y[s:s + BATCH]
            opt.zero_grad()
            out = forward(ps, xb)
            lossv = loss_fn(loss, out, yb)
            lossv.backward()
            opt.step()
    return [p.detach().numpy() for p in ps]


def forward(ps, x):
    h = x
    nl = len(ps) // 2
    for i in range(nl):
        h = F.linear(h, ps[2 * i], ps[2 * i + 1])
        if i + 1 < nl:
            h = F.relu(h)
    return h


def loss_fn(loss, out, y):
    if loss == "softmax":
        return F.cross_entropy(out, y.long())
    if loss == "logistic":
        return F.binary_cross_entropy_with_logits(out.squeeze(1), y)
    return F.mse_loss(out.squeeze(1), y)


for loss in ("softmax", "logistic", "mse"):
    rng = np.random.default_rng({"softmax": 1, "logistic": 2, "mse": 3}[loss])
    x, y = make_data(loss, rng)
    out_w = 4 if loss == "softmax" else 1
    data = os.path.join(work, f"{loss}.csv")
    with open(data, "w") as f:
        for i in range(N):
            f.write(",".join([repr(float(y[i]))] + [repr(float(v)) for v in x[i]]) + "\n")
    params = [rng.uniform(-0.5, 0.5, size=(H, D)).astype(np.float32),
              rng.uniform(-0.1, 0.1, size=H).astype(np.float32),
              rng.uniform(-0.5, 0.5, size=(out_w, H)).astype(np.float32),
              rng.uniform(-0.1, 0.1, size=out_w).astype(np.float32)]
    init = os.path.join(work, f"{loss}-init.safetensors")
    st.write(init, [("layers.0.weight", params[0]), ("layers.0.bias", params[1]),
                    ("layers.1.weight", params[2]), ("layers.1.bias", params[3])])
    for optim in ("sgd", "momentum", "adagrad"):
        out = os.path.join(work, f"{loss}-{optim}.safetensors")
        cmd = [freshet, "fit", "--layers", f"{D}-{H}-{out_w}", "--loss", loss, "--data", data,
               "--format", "csv", "--epochs", str(EPOCHS), "--batch", str(BATCH), "--lr",
               str(LR), "--optimizer", optim, "--momentum", str(MU), "--init", init,
               "--no-shuffle", "--backend", "cpu", "--out", out]
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        got, meta = st.read(out)
        assert meta["format"] == "pt" and meta["freshet.loss"] == loss
        want = torch_fit(loss, optim, params, x, y)
        names = ["layers.0.weight", "layers.0.bias", "layers.1.weight", "layers.1.bias"]
        worst = 0.0
        ok = True
        for name, w in zip(names, want):
            g = got[name]
            assert g.shape == w.shape, (name, g.shape, w.shape)
            err = np.abs(g - w)
            worst = max(worst, float(np.max(err / (np.abs(w) + 1e-3))))
            if not np.all(err <= 1e-6 + 1e-4 * np.abs(w)):
                ok = False
        moved = max(float(np.max(np.abs(w - p))) for w, p in zip(want, params))
        # freshet eval on the training data, against torch's loss of its final weights
        res = json.loads(subprocess.run([freshet, "eval", "--weights", out, "--data", data,
                                         "--format", "csv", "--backend", "cpu"], check=True,
                                        capture_output=True, text=True).stdout)
        with torch.no_grad():
            ps = [torch.tensor(w) for w in want]
            o = forward(ps, torch.tensor(x))
            tl = float(loss_fn(loss, o, torch.tensor(y)))
        eval_ok = res["n"] == N and abs(res["loss"] - tl) <= 1e-4 * abs(tl) + 1e-6
        if loss != "mse":
            if loss == "softmax":
                acc = float((o.argmax(1) == torch.tensor(y).long()).float().mean())
            else:
                acc = float(((o.squeeze(1) > 0).float() == torch.tensor(y)).float().mean())
            eval_ok = eval_ok and abs(res["accuracy"] - acc) < 0.5 / N  # one sample is 1/N
        status = "ok" if ok and eval_ok else "FAIL"
        print(f"{status}: {loss:8s} {optim:8s} max rel err {worst:.2e} (weights moved up to "
              f"{moved:.3f}); eval loss {res['loss']:.6f} vs torch {tl:.6f}")
        failures += not (ok and eval_ok)

print(f"{9 - failures} passed, {failures} failed")
sys.exit(1 if failures else 0)
