#!/usr/bin/env bash
# freshet fit against PyTorch doing the same training in the same run:
# Fashion-MNIST, 784-256-10, softmax, sgd lr 0.1, batch 64, shuffled, one
# thread each. Prints both throughputs (median epoch) and their ratio, after
# checking that both actually learned (test accuracy >= 0.80).
# usage: bench/fit_vs_torch.sh [EPOCHS] [FRESHET]   (defaults: 3, build/freshet)
set -euo pipefail
cd "$(dirname "$0")/.."
epochs=${1:-3}
freshet=${2:-build/freshet}
fm=/usr/share/datasets/fashion-mnist
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

"$freshet" fit --layers 784-256-10 --loss softmax --optimizer sgd --lr 0.1 --batch 64 \
    --epochs "$epochs" --seed 42 --backend cpu --format idx \
    --data "$fm/train-images-idx3-ubyte.gz" --labels "$fm/train-labels-idx1-ubyte.gz" \
    --test-data "$fm/t10k-images-idx3-ubyte.gz" --test-labels "$fm/t10k-labels-idx1-ubyte.gz" \
    --out "$work/w.safetensors" >"$work/freshet.log"
/usr/bin/python3 bench/torch_fit.py "$epochs" 64 0.1 >"$work/torch.log"

/usr/bin/python3 - "$work/freshet.log" "$work/torch.log" "$epochs" <<'PY'
import statistics, sys
import torch

def parse(path):
    rate, acc = [], None
    for line in open(path):
        f = line.split()
        if f and f[0] == "epoch":
            rate.append(float(f[f.index("samples/s") + 1]))
            acc = float(f[f.index("test_accuracy") + 1])
    return statistics.median(rate), acc

fr, fa = parse(sys.argv[1])
tr, ta = parse(sys.argv[2])
for name, acc in (("freshet", fa), ("pytorch", ta)):
    if acc < 0.80:
        sys.exit(f"{name} did not learn (test accuracy {acc:.4f} < 0.80): figures invalid")
print(f"fit: Fashion-MNIST 784-256-10 softmax, sgd lr 0.1, batch 64, 1 thread, "
      f"{sys.argv[3]} epochs (median epoch)")
print(f"  {'':22s} {'samples/s':>10s}  {'test accuracy':>13s}")
print(f"  {'freshet fit (cpu)':22s} {fr:10.0f}  {fa:13.4f}")
print(f"  {'pytorch ' + torch.__version__:22s} {tr:10.0f}  {ta:13.4f}")
print(f"  ratio freshet/pytorch: {fr / tr:.2f}")
PY
