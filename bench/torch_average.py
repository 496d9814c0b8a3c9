"""The served average's rule checked in PyTorch, away from freshet: the
same MLP as bench/torch_fit.py (Fashion-MNIST, 784-256-10, SGD lr 0.1,
batch 64, 2 epochs, one thread), trained once per seed, with three served
models beside it:

  last    the last iterate (what a model served before the average)
  every   freshet's rule: after every update of n samples,
          avg += a (w - avg), a = 1 - exp(-n / h), h = min(H, seen / 10)
  tenth   the same average, taking w in only once n samples since its
          last step reach h / 10 (tried, not kept: bench/README.md)

Prints each seed's final test accuracy of the three and the samples each
took to reach 0.83 (checked every 40 updates), then the mean and the sd
over seeds, and the mean paired difference of tenth against every.

usage: /usr/bin/python3 bench/torch_average.py [FIRST_SEED] [SEEDS] [H]
       (defaults: 42, 6 seeds, H = 6400 samples, freshet's default)
"""
import gzip
import math
import sys

import numpy as np
import torch
import torch.nn.functional as F

FM = "/usr/share/datasets/fashion-mnist"
KINDS = ("last", "every", "tenth")


def idx(path, offset):
    with gzip.open(path, "rb") as f:
        return np.frombuffer(f.read(), dtype=np.uint8, offset=offset)


def images(name):
    raw = idx(f"{FM}/{name}-images-idx3-ubyte.gz", 16).reshape(-1, 784) / 255.0
    return torch.tensor(raw, dtype=torch.float32)


def labels(name):
    return torch.tensor(idx(f"{FM}/{name}-labels-idx1-ubyte.gz", 8).astype(np.int64))


def accuracy(params, tx, ty):
    w1, b1, w2, b2 = params
    with torch.no_grad():
        return ((torch.relu(tx @ w1 + b1) @ w2 + b2).argmax(1) == ty).float().mean().item()


def one_seed(seed, horizon, x, y, tx, ty):
    g = torch.Generator().manual_seed(seed)

    def he_uniform(fan_in, fan_out):
        bound = math.sqrt(6.0 / fan_in)
        return ((torch.rand(fan_in, fan_out, generator=g) * 2 - 1) * bound).requires_grad_()

    params = [he_uniform(784, 256), torch.zeros(256, requires_grad=True),
              he_uniform(256, 10), torch.zeros(10, requires_grad=True)]
    avg = {k: [p.detach().clone() for p in params] for k in ("every", "tenth")}
    pending = 0
    seen = 0
    reached = dict.fromkeys(KINDS)
    for _ in range(2):
        perm = torch.randperm(x.shape[0], generator=g)
        for step, i in enumerate(range(0, x.shape[0], 64)):
            j = perm[i:i + 64]
            w1, b1, w2, b2 = params
            loss = F.cross_entropy(torch.relu(x[j] @ w1 + b1) @ w2 + b2, y[j])
            for p in params:
                p.grad = None
            loss.backward()
            n = len(j)
            seen += n
            pending += n
            with torch.no_grad():
                for p in params:
                    p -= 0.1 * p.grad
                h = min(horizon, seen / 10)
                steps = {"every": n}
                if pending >= h / 10:
                    steps["tenth"] = pending
                    pending = 0
                for kind, m in steps.items():
                    a = 1 - math.exp(-m / h)
                    for e, p in zip(avg[kind], params):
                        e.add_(p - e, alpha=a)
            if step % 40 == 0:
                for kind in KINDS:
                    model = params if kind == "last" else avg[kind]
                    if reached[kind] is None and accuracy(model, tx, ty) >= 0.83:
                        reached[kind] = seen
    final = [accuracy(params if k == "last" else avg[k], tx, ty) for k in KINDS]
    return final, [reached[k] for k in KINDS]


def main():
    first = int(sys.argv[1]) if len(sys.argv) > 1 else 42
    seeds = int(sys.argv[2]) if len(sys.argv) > 2 else 6
    horizon = float(sys.argv[3]) if len(sys.argv) > 3 else 6400
    torch.set_num_threads(1)
    x, y, tx, ty = images("train"), labels("train"), images("t10k"), labels("t10k")
    finals = []
    print("seed  " + "  ".join(f"{k:>6}" for k in KINDS) + "  samples to 0.83")
    for seed in range(first, first + seeds):
        final, reached = one_seed(seed, horizon, x, y, tx, ty)
        finals.append(final)
        print(f"{seed:4d}  " + "  ".join(f"{a:6.4f}" for a in final) + "  " +
              " ".join(str(r) if r is not None else "never" for r in reached), flush=True)
    a = np.array(finals)
    print("mean  " + "  ".join(f"{m:6.4f}" for m in a.mean(0)))
    if len(finals) > 1:
        print("sd    " + "  ".join(f"{s:6.4f}" for s in a.std(0, ddof=1)))
        d = a[:, 2] - a[:, 1]
        print(f"tenth - every: {d.mean():+.4f} (paired sd {d.std(ddof=1):.4f})")


if __name__ == "__main__":
    main()
