"""The chaos suite's ledger (docs/operations.md "The ledger: exactly once
from the weights"): the weights a correct freshet must hold, recomputed with
numpy from the records the topic holds, and compared with the weights Redis
holds. It trusts nothing freshet writes about itself (no audit, no
watermark, no counter).

The ledger model is a logistic regression held in saturation: it starts at
weights 0 and bias B0 = -8192, and every record has label 1 and features in
{-1, 0, 1}. While z = w.x + b stays below -104, sigmoid(z) is exactly 0 in
float32, so the gradient of a record is exactly -(x, 1), whatever the
weights: with batches of one and plain SGD at a constant rate of 2^-10,
applying a record adds exactly 2^-10 (x, 1) to (w, b). The weights are then
a sum over the multiset of records applied, the same in any order and with
any staleness, and every partial sum is a multiple of 2^-10 below 2^13, so
float32 holds it exactly: the weights must equal the recomputation bit for
bit. A record applied twice shows as +2^-10 (x, 1), a record lost as
-2^-10 (x, 1); the bias alone counts the records applied.

usage: ledger.py init PATH FEATURES
       ledger.py check TOPIC WEIGHTS FEATURES
  init writes the initial weights (safetensors) that [model] init names;
  check reads TOPIC (the record values, float32 [label, x...] each, as the
  topic holds them) and WEIGHTS (the w:0 value of the store, float32 w then
  b) and exits 0 when they agree, 1 with the difference otherwise.
"""
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "ref"))
import st  # noqa: E402  (tests/ref/st.py: safetensors written from the format description)

LR = 2.0 ** -10
B0 = -8192.0
MAX_ABS = 1e6      # [ingest] max_abs_feature's default: larger records are rejected
SATURATED = -104.0  # below it expf(z) underflows to 0 in float32


def init(path, features):
    st.write(path, [("layers.0.weight", np.zeros((1, features), np.float32)),
                    ("layers.0.bias", np.array([B0], np.float32))],
             {"format": "pt", "freshet.layers": "%d-1" % features, "freshet.loss": "logistic"})


def check(topic, weights, features):
    rec = np.fromfile(topic, dtype="<f4").reshape(-1, 1 + features).astype(np.float64)
    y, x = rec[:, 0], rec[:, 1:]
    # the records freshet must train: every value finite, every feature
    # within max_abs_feature, the label a class of the logistic loss
    ok = np.isfinite(rec).all(axis=1) & (np.abs(x) <= MAX_ABS).all(axis=1) & (y == 1.0)
    n = int(ok.sum())
    want = np.concatenate([LR * x[ok].sum(axis=0), [B0 + LR * n]])
    got = np.fromfile(weights, dtype="<f4").astype(np.float64)
    if got.size != features + 1:
        print("ledger: the store holds %d weights, the ledger model has %d" %
              (got.size, features + 1))
        return 1
    # the regime the ledger needs: z below SATURATED for every record at
    # every step. Any weights on the way are partial sums, so |w_j| is at
    # most LR * sum_i |x_ij| and b at most the final b: a bound that holds
    # in any order.
    bound = got[-1] + LR * np.abs(x[ok]).sum(axis=0) @ np.ones(features)
    applied = (got[-1] - B0) / LR
    print("ledger: %d records in the topic, %d to train (%d rejected); the store's bias "
          "counts %.0f applied; z bound %.1f" % (len(rec), n, len(rec) - n, applied, bound))
    if bound >= SATURATED:
        print("ledger: FAILED: the stream is too long for the ledger (z may reach %.1f): "
              "the weights are no longer a sum" % bound)
        return 1
    diff = got - want
    if np.all(diff == 0.0):
        print("ledger: the weights equal the recomputation bit for bit")
        return 0
    print("ledger: FAILED: the weights differ from the recomputation: %+.0f records in the "
          "bias (%s), feature sums off by %s (in records of weight %g)" %
          (applied - n, "doubled" if applied > n else "lost", np.round(diff[:-1] / LR, 3), LR))
    return 1


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "init":
        init(sys.argv[2], int(sys.argv[3]))
        sys.exit(0)
    if len(sys.argv) == 5 and sys.argv[1] == "check":
        sys.exit(check(sys.argv[2], sys.argv[3], int(sys.argv[4])))
    sys.exit(__doc__)
