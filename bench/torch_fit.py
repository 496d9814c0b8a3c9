"""PyTorch doing the same training as `freshet fit` in bench/fit_vs_torch.sh:
Fashion-MNIST, 784-256-10 (ReLU), softmax cross-entropy, SGD, shuffled
mini-batches, one thread. Prints one line per epoch in freshet's format so
the benchmark parses both the same way.

usage: torch_fit.py EPOCHS BATCH LR
"""
import gzip
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

FM = "/usr/share/datasets/fashion-mnist"


def idx(path, offset):
    with gzip.open(path, "rb") as f:
        return np.frombuffer(f.read(), dtype=np.uint8, offset=offset)


def main():
    epochs, batch, lr = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
    torch.set_num_threads(1)
    torch.manual_seed(42)
    x = torch.tensor(idx(f"{FM}/train-images-idx3-ubyte.gz", 16).reshape(-1, 784) / 255.0,
                     dtype=torch.float32)
    y = torch.tensor(idx(f"{FM}/train-labels-idx1-ubyte.gz", 8).astype(np.int64))
    tx = torch.tensor(idx(f"{FM}/t10k-images-idx3-ubyte.gz", 16).reshape(-1, 784) / 255.0,
                      dtype=torch.float32)
    ty = torch.tensor(idx(f"{FM}/t10k-labels-idx1-ubyte.gz", 8).astype(np.int64))
    model = torch.nn.Sequential(torch.nn.Linear(784, 256), torch.nn.ReLU(),
                                torch.nn.Linear(256, 10))
    for m in model:  # He-uniform weights, zero biases: freshet's initialisation
        if isinstance(m, torch.nn.Linear):
            torch.nn.init.kaiming_uniform_(m.weight, nonlinearity="relu")
            torch.nn.init.zeros_(m.bias)
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    n = x.shape[0]
    for e in range(1, epochs + 1):
        t0 = time.perf_counter()
        perm = torch.randperm(n)
        total = 0.0
        for s in range(0, n, batch):
            i = perm[s:s + batch]
            opt.zero_grad(set_to_none=True)
            loss = F.cross_entropy(model(x[i]), y[i])
            loss.backward()
            opt.step()
            total += loss.item() * len(i)
        secs = time.perf_counter() - t0
        with torch.no_grad():
            acc = (model(tx).argmax(1) == ty).float().mean().item()
        print(f"epoch {e}/{epochs}  loss {total / n:.6f}  samples/s {n / secs:.0f}  "
              f"({secs:.2f} s)  test_accuracy {acc:.4f}", flush=True)


if __name__ == "__main__":
    main()
