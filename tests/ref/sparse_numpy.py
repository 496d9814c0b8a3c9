"""freshet fit-sparse against a numpy reference of the factorization
machine (docs/design.md "Sparse models"): the same binary records, read
and hashed here (XXH64 through ctypes from Debian's libxxhash, the library
freshet links), the same batches, the FM's score, loss and gradient by
their definitions (the O(F^2 D) pairwise sum, in float64), each row's
initial value from its seed (splitmix64) and Adagrad per coordinate.

Checks, in order:
  1. the table fit-sparse starts from: every row's initial value, bit for
     bit (a run frozen after its first batch leaves untouched rows as
     they began);
  2. the forward and backward pass: the first batch's progressive logloss
     (scored before any update) to 1e-6, and the table after one batch
     (Adagrad's first step divides the gradient by its own magnitude, so
     the sign of every coordinate's gradient is checked, and the rows it
     touched);
  3. training: the table and bias after every record, batch after batch,
     within 1e-4 (float32 against float64), and the progressive logloss
     of all records to 1e-5.

usage: sparse_numpy.py FRESHET WORKDIR
"""
import ctypes
import struct
import subprocess
import sys

import numpy as np

import st

BITS, DIM, FIELDS = 12, 4, 39
SPEC = f"fields:{FIELDS},buckets:2^{BITS},dim:{DIM}"
N, BATCH, LR, SEED, INIT_STD = 2048, 256, 0.05, 42, 0.01
M64 = (1 << 64) - 1

xxh = ctypes.CDLL("libxxhash.so.0")
xxh.XXH64.restype = ctypes.c_uint64
xxh.XXH64.argtypes = [ctypes.c_char_p, ctypes.c_size_t, ctypes.c_uint64]


def mix64(x):
    """splitmix64's mix, as sparse/optim.c."""
    x = (x + 0x9E3779B97F4A7C15) & M64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & M64
    return x ^ (x >> 31)


def row_init(row):
    """A row never written: linear 0, embedding uniform with sd INIT_STD."""
    a = np.float64(np.float32(INIT_STD)) * np.sqrt(3.0)
    h = mix64((mix64(SEED) + row) & M64)
    v = np.zeros(1 + DIM, dtype=np.float32)
    for d in range(DIM):
        h = mix64(h)
        u = (h >> 11) * (1.0 / 9007199254740992.0)
        v[1 + d] = np.float32((2 * u - 1) * a)
    return v


def read_records(path):
    """[(label, [row, ...])] of a file of binary records after their length."""
    data, at, out = open(path, "rb").read(), 0, []
    while at < len(data):
        (n,) = struct.unpack_from("<I", data, at)
        rec, at = data[at + 4:at + 4 + n], at + 4 + n
        label, count = rec[0], rec[1]
        rows = []
        for k in range(count):
            field = rec[2 + 9 * k]
            ident = rec[3 + 9 * k:11 + 9 * k]  # the id's 8 bytes little-endian
            rows.append(xxh.XXH64(ident, 8, field) >> (64 - BITS))
        out.append((label, rows))
    return out


def fm_batch(table, bias, batch):
    """Scores, summed logloss and the gradient {row: g[1 + D]} and the
    bias's, by the definitions, in float64."""
    grads, gbias, loss = {}, 0.0, 0.0
    for label, rows in batch:
        w = [table[r].astype(np.float64) for r in rows]
        s = float(bias) + sum(x[0] for x in w)
        for i in range(len(rows)):
            for j in range(i + 1, len(rows)):
                s += float(np.dot(w[i][1:], w[j][1:]))
        p = 1.0 / (1.0 + np.exp(-s))
        pc = min(max(p, 1e-7), 1 - 1e-7)
        loss += -(label * np.log(pc) + (1 - label) * np.log(1 - pc))
        e = p - label  # d loss / d score
        gbias += e
        total = sum(x[1:] for x in w)
        for i, r in enumerate(rows):
            g = np.zeros(1 + DIM)
            g[0] = e
            g[1:] = e * (total - w[i][1:])  # d s / d v_i = sum over j != i of v_j
            grads[r] = grads.get(r, 0) + g
    return grads, gbias, loss


def fit_sparse(freshet, work, data, out, extra=()):
    cmd = [freshet, "fit-sparse", "--sparse", SPEC, "--data", data, "--format", "binary",
           "--optimizer", "adagrad", "--lr", str(LR), "--seed", str(SEED), "--batch",
           str(BATCH), "--window", str(BATCH), "--out", out, *extra]
    text = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    windows = [float(line.split("logloss ")[1].split(",")[0])
               for line in text.splitlines() if line.startswith("window ")]
    final = [float(line.split("progressive logloss ")[1].split(",")[0])
             for line in text.splitlines() if "progressive logloss" in line]
    return windows, final[-1]


def main():
    freshet, work = sys.argv[1], sys.argv[2]
    data = f"{work}/ctr.bin"
    subprocess.run([freshet, "produce", "--synthetic", "ctr", "--seed", "3", "--encode",
                    "binary", "--out", data, "--limit", str(N)], check=True,
                   capture_output=True)
    records = read_records(data)
    assert len(records) == N

    # 1 and 2: one batch learned, the rest scored by the frozen table
    windows1, _ = fit_sparse(freshet, work, data, f"{work}/one.st", ("--freeze-after", "1"))
    one, _ = st.read(f"{work}/one.st")
    init = np.stack([row_init(r) for r in range(1 << BITS)])
    grads, gbias, loss = fm_batch(init, 0.0, records[:BATCH])
    untouched = [r for r in range(1 << BITS) if r not in grads]
    assert np.array_equal(one["rows"][untouched], init[untouched]), "initial rows differ"
    loss1 = loss / BATCH
    assert abs(windows1[0] - loss1) < 1e-5, (windows1[0], loss1)  # printed %.5f
    signs = 0
    for r, g in grads.items():
        step = one["rows"][r].astype(np.float64) - init[r]
        for c in range(1 + DIM):
            if abs(g[c]) > 1e-4:  # Adagrad's first step: -lr sign(g), to 1e-6 from here
                assert abs(step[c] + LR * np.sign(g[c])) < 1e-6, (r, c, step[c], g[c])
                signs += 1
    assert abs(one["bias"][0] + LR * np.sign(gbias)) < 1e-6

    # 3: every batch, Adagrad per coordinate
    table, acc = init.astype(np.float64), np.zeros((1 << BITS, 1 + DIM))
    bias, bacc, total = 0.0, 0.0, 0.0
    for at in range(0, N, BATCH):
        grads, gbias, loss = fm_batch(table, bias, records[at:at + BATCH])
        total += loss
        for r, g in grads.items():
            acc[r] += g * g
            table[r] -= LR * g / (np.sqrt(acc[r]) + 1e-10)
        bacc += gbias * gbias
        bias -= LR * gbias / (np.sqrt(bacc) + 1e-10)
    windows, final = fit_sparse(freshet, work, data, f"{work}/all.st")
    trained, _ = st.read(f"{work}/all.st")
    worst = float(np.max(np.abs(trained["rows"].astype(np.float64) - table)))
    assert worst < 1e-4, worst
    assert abs(float(trained["bias"][0]) - bias) < 1e-4, (trained["bias"][0], bias)
    assert abs(final - total / N) < 1.5e-5, (final, total / N)  # printed %.5f
    assert signs > 1000
    print(f"sparse FM against numpy: {len(untouched)} untouched rows at their initial values "
          f"bit for bit; batch 1 logloss {windows1[0]:.5f} (numpy {loss1:.6f}), {signs} "
          f"gradient signs; after {N // BATCH} batches the table within {worst:.2g}, bias "
          f"{bias:.6f}, progressive logloss {final:.5f} (numpy {total / N:.6f})")


if __name__ == "__main__":
    main()
