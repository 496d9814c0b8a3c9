#!/usr/bin/env bash
# Fashion-MNIST, 784-256-10, softmax, sgd, lr 0.1, batch 64, shuffled:
#  - test accuracy after 1 epoch at least 0.80, as the mean over seeds 1..5
#    (one epoch ends on whatever the last lr-0.1 steps did: single runs of
#    freshet and of PyTorch both land anywhere in 0.78..0.84);
#  - test accuracy after 10 epochs at least 0.86 (seed 42);
#  - freshet eval scores the written weights exactly as the last epoch did.
# usage: $0 FRESHET
set -euo pipefail
fm=/usr/share/datasets/fashion-mnist
if [ ! -f "$fm/train-images-idx3-ubyte.gz" ]; then
    echo "FAIL: $fm missing (apt-get install dataset-fashion-mnist)"
    exit 1
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fit() { # seed epochs
    "$FRESHET" fit --layers 784-256-10 --loss softmax --optimizer sgd --lr 0.1 --batch 64 \
        --epochs "$2" --seed "$1" --backend cpu --format idx \
        --data "$fm/train-images-idx3-ubyte.gz" --labels "$fm/train-labels-idx1-ubyte.gz" \
        --test-data "$fm/t10k-images-idx3-ubyte.gz" \
        --test-labels "$fm/t10k-labels-idx1-ubyte.gz" --out "$work/w.safetensors"
}
accuracy() { # log epoch
    awk -v e="$2" '$1 == "epoch" && $2 ~ "^" e "/" {
        for (i = 1; i < NF; i++) if ($i == "test_accuracy") print $(i + 1) }' "$1"
}
FRESHET=$1
one_epoch=()
for seed in 1 2 3 4 5; do
    fit "$seed" 1 >"$work/log1"
    one_epoch+=("$(accuracy "$work/log1" 1)")
done
echo "1 epoch, seeds 1..5: ${one_epoch[*]}"
fit 42 10 | tee "$work/log10"
acc10=$(accuracy "$work/log10" 10)
eval_json=$("$FRESHET" eval --weights "$work/w.safetensors" --format idx \
    --data "$fm/t10k-images-idx3-ubyte.gz" --labels "$fm/t10k-labels-idx1-ubyte.gz")
echo "eval: $eval_json"
/usr/bin/python3 - "$acc10" "$eval_json" "${one_epoch[@]}" <<'PY'
import json, sys
acc10, ev = float(sys.argv[1]), json.loads(sys.argv[2])
one = [float(a) for a in sys.argv[3:]]
mean1 = sum(one) / len(one)
checks = [
    ("mean test accuracy after 1 epoch >= 0.80", mean1 >= 0.80, round(mean1, 4)),
    ("test accuracy after 10 epochs >= 0.86", acc10 >= 0.86, acc10),
    ("eval n == 10000", ev["n"] == 10000, ev["n"]),
    ("eval accuracy == epoch 10 accuracy", abs(ev["accuracy"] - acc10) < 1e-4, ev["accuracy"]),
]
failed = 0
for name, ok, value in checks:
    print(f"{'ok' if ok else 'FAIL'}: {name} ({value})")
    failed += not ok
print(f"{len(checks) - failed} passed, {failed} failed")
sys.exit(1 if failed else 0)
PY
