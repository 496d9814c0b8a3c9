#!/usr/bin/python3
"""Delta freshness of a sparse model (docs/design.md "Serving sparse models").

Polls GET /v2/models/M/delta?since=V every PERIOD ms for SECONDS seconds, as
an inference service following the model would, and notes when each version
was first served. Then reads the model's versions stream from Redis (each
applied batch's version and the Kafka timestamps of its oldest and newest
record) and prints, over the batches served, the time from a record's Kafka
timestamp to the delta that carried its rows: p50 and p99 for the newest and
the oldest record of each batch. Standard library only (Debian's python3).

usage: delta_poll.py HTTP_PORT REDIS_PORT MODEL SECONDS PERIOD_MS
"""
import json
import socket
import struct
import sys
import time
import urllib.request


def resp_command(sock, *args):
    """Sends one Redis command (RESP) and returns its parsed reply."""
    out = b"*%d\r\n" % len(args)
    for a in args:
        a = a.encode() if isinstance(a, str) else a
        out += b"$%d\r\n%s\r\n" % (len(a), a)
    sock.sendall(out)
    f = sock.makefile("rb")
    return read_reply(f)


def read_reply(f):
    line = f.readline()
    kind, rest = line[:1], line[1:-2]
    if kind == b"*":
        n = int(rest)
        return None if n < 0 else [read_reply(f) for _ in range(n)]
    if kind == b"$":
        n = int(rest)
        if n < 0:
            return None
        data = f.read(n + 2)
        return data[:-2]
    if kind == b":":
        return int(rest)
    if kind == b"-":
        raise RuntimeError(rest.decode())
    return rest


def percentile(values, p):
    v = sorted(values)
    return v[min(len(v) - 1, int(p * len(v)))] if v else float("nan")


def main():
    http_port, redis_port, model = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    seconds, period = float(sys.argv[4]), float(sys.argv[5]) / 1000.0
    base = "http://127.0.0.1:%d/v2/models/%s/delta" % (http_port, model)
    since, served, nbytes, polls = 0, [], 0, 0
    deadline = time.time() + seconds
    while time.time() < deadline:
        try:
            with urllib.request.urlopen("%s?since=%d&max_rows=16384" % (base, since)) as r:
                body = r.read()
        except OSError as e:  # not created yet, or 503 while starting
            time.sleep(period)
            continue
        now_ms = time.time() * 1000.0
        polls += 1
        nbytes += len(body)
        hlen = struct.unpack("<Q", body[:8])[0]
        meta = json.loads(body[8:8 + hlen])["__metadata__"]
        version = int(meta["freshet.version"])
        if version > since:
            served.append((since, version, now_ms))
            since = version
        if meta["freshet.more"] != "true":
            time.sleep(period)
    sock = socket.create_connection(("127.0.0.1", redis_port))
    entries = resp_command(sock, "XRANGE", "freshet:{%s}:versions" % model, "-", "+")
    batches = []  # (version, ts_min, ts_max)
    for _, fields in entries:
        kv = dict(zip(fields[0::2], fields[1::2]))
        if b"ts" not in kv or b"version" not in kv:
            continue
        lo, hi = (int(x) for x in kv[b"ts"].split(b":"))
        if lo > 0:
            batches.append((int(kv[b"version"]), lo, hi))
    newest, oldest = [], []
    k = 0
    batches.sort()
    for prev, version, t in served:
        while k < len(batches) and batches[k][0] <= version:
            if batches[k][0] > prev:
                newest.append(t - batches[k][2])
                oldest.append(t - batches[k][1])
            k += 1
    print("delta_poll: %d polls, %d versions served, %d batches matched, %.0f KB/s of deltas"
          % (polls, len(served), len(newest), nbytes / 1024.0 / seconds))
    print("freshness (Kafka timestamp to /delta) ms: newest record of a batch p50 %.0f p99 %.0f;"
          " oldest p50 %.0f p99 %.0f"
          % (percentile(newest, 0.5), percentile(newest, 0.99), percentile(oldest, 0.5),
             percentile(oldest, 0.99)))


if __name__ == "__main__":
    main()
