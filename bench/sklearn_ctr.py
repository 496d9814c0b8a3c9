#!/usr/bin/python3
"""scikit-learn's peer of freshet fit-sparse: SGDClassifier(loss='log_loss')
on FeatureHasher features, trained by partial_fit on a Criteo-layout file
in file order, with the same progressive validation (each batch scored by
predict_proba before partial_fit learns from it) and the same features:
integers bucketed as sparse/layout.c does (v > 2: 3 + floor(ln(v)^2)),
each column a field of its own.

usage: sklearn_ctr.py FILE BITS WINDOW [BATCH]
prints one line per window ("window I: N records, logloss L") and the mean
("N records, progressive logloss L").
"""
import math
import sys

import numpy as np
from sklearn.feature_extraction import FeatureHasher
from sklearn.linear_model import SGDClassifier


def features(cols):
    out = []
    for k in range(13):
        v = cols[1 + k]
        if v:
            n = int(v)
            b = n if n <= 2 else 3 + int(math.log(n) ** 2)
            out.append("i%d=%d" % (k, b))
    for k in range(26):
        v = cols[14 + k]
        if v:
            out.append("c%d=%s" % (k, v))
    return out


def main():
    path, bits, window = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    batch = int(sys.argv[4]) if len(sys.argv) > 4 else 1024
    hasher = FeatureHasher(n_features=1 << bits, input_type="string", alternate_sign=False)
    model = SGDClassifier(loss="log_loss")
    eps = 1e-7
    total, total_n, win, win_n, index = 0.0, 0, 0.0, 0, 0
    rows, labels = [], []

    def step():
        nonlocal total, total_n, win, win_n, index
        X = hasher.transform(rows)
        y = np.array(labels)
        if total_n == 0:
            p = np.full(len(y), 0.5)
        else:
            p = np.clip(model.predict_proba(X)[:, 1], eps, 1 - eps)
        model.partial_fit(X, y, classes=[0, 1])
        loss = -(y * np.log(p) + (1 - y) * np.log1p(-p))
        for l in loss:
            win += l
            win_n += 1
            total += l
            total_n += 1
            if win_n == window:
                print("window %d: %d records, logloss %.5f" % (index, win_n, win / win_n))
                sys.stdout.flush()
                index, win, win_n = index + 1, 0.0, 0
        rows.clear()
        labels.clear()

    with open(path) as f:
        for line in f:
            cols = line.rstrip("\n").split("\t")
            if len(cols) != 40:
                continue
            rows.append(features(cols))
            labels.append(int(cols[0]))
            if len(rows) == batch:
                step()
    if rows:
        step()
    print("%d records, progressive logloss %.5f" % (total_n, total / total_n))


if __name__ == "__main__":
    main()
