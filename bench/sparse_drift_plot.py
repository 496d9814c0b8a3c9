#!/usr/bin/python3
"""Plots bench/sparse_quality.sh's drift curve (CURVE=file, DRIFT > 0): per
window, the Bayes-optimal logloss of the drifting stream, the progressive
logloss of the FM trained online, and that of the same FM frozen after its
first records. Writes a PNG.

usage: sparse_drift_plot.py CURVE.csv OUT.png [FREEZE]
"""
import csv
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main():
    path, out = sys.argv[1], sys.argv[2]
    freeze = int(sys.argv[3]) if len(sys.argv) > 3 else None
    rows = list(csv.DictReader(open(path)))
    x = [int(r["records"]) / 1e6 for r in rows]
    fig, ax = plt.subplots(figsize=(7, 4), dpi=110)
    ax.plot(x, [float(r["floor"]) for r in rows], "k--", label="Bayes floor")
    ax.plot(x, [float(r["live"]) for r in rows], "C0-o", ms=3, label="FM trained online")
    ax.plot(x, [float(r["frozen"]) for r in rows], "C3-s", ms=3, label="the same FM, frozen")
    if freeze:
        ax.axvline(freeze / 1e6, color="grey", lw=0.8)
        ax.text(freeze / 1e6, ax.get_ylim()[1], " frozen here", va="top", fontsize=8)
    ax.set_xlabel("records (millions)")
    ax.set_ylabel("progressive logloss per window")
    ax.set_title("Synthetic click stream with drift: training online against a frozen model",
                 fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out)


if __name__ == "__main__":
    main()
