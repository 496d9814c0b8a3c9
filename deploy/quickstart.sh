#!/usr/bin/env bash
# The main job on the embedded default: set up, build, then train
# 784-256-10 on Fashion-MNIST (the Debian package dataset-fashion-mnist)
# offline with freshet fit, printing progress and holdout accuracy per epoch,
# and score the written weights with freshet eval.
set -euo pipefail
cd "$(dirname "$0")/.."
bash deploy/setup.sh
bash deploy/build.sh
fm=/usr/share/datasets/fashion-mnist
out=build/fashion-mnist.safetensors
epochs=${EPOCHS:-10}
./build/freshet fit --layers 784-256-10 --loss softmax --optimizer sgd --lr 0.1 --batch 64 \
    --epochs "$epochs" --seed 42 --format idx \
    --data "$fm/train-images-idx3-ubyte.gz" --labels "$fm/train-labels-idx1-ubyte.gz" \
    --test-data "$fm/t10k-images-idx3-ubyte.gz" --test-labels "$fm/t10k-labels-idx1-ubyte.gz" \
    --out "$out"
echo "test set:"
./build/freshet eval --weights "$out" --format idx \
    --data "$fm/t10k-images-idx3-ubyte.gz" --labels "$fm/t10k-labels-idx1-ubyte.gz"
