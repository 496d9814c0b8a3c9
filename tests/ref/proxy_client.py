"""A Redis client on a bare socket, for test_delay_proxy.sh: it times round
trips, pipelines commands and floods a target that never reads, speaking
RESP as the Redis protocol page describes it (no redis module, nothing of
freshet's). Each command prints one line of results for the shell to check.

  ping PORT N               N PINGs one after another: "min median max" in ms
  pipeline PORT             2,000 INCRs in one write, answered in order, and
                            32 values of 1 MiB set and read back pipelined:
                            "ok" or the first difference
  name PORT                 connects, names itself proxytest and closes: "ok"
  closed PORT               connects, names itself, waits for the server to
                            close it: "closed after S s" (or "still open")
  flood PROXY DELAY_US      a proxy in front of a listener that never reads;
                            writes to it until nothing more goes in, then
                            stops the proxy: "BYTES accepted, proxy peak KIB
                            KiB, exit STATUS"
"""
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time


def connect(port):
    s = socket.create_connection(("127.0.0.1", port), timeout=30)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return s


def command(*args):
    """One command in RESP: an array of bulk strings."""
    out = [b"*%d\r\n" % len(args)]
    for a in args:
        a = a if isinstance(a, bytes) else str(a).encode()
        out.append(b"$%d\r\n%s\r\n" % (len(a), a))
    return b"".join(out)


class Reader:
    """Replies from a socket: +simple, -error, :integer, $bulk (None for nil)."""

    def __init__(self, sock):
        self.sock, self.buf = sock, bytearray()

    def _fill(self):
        data = self.sock.recv(1 << 20)
        if not data:
            raise EOFError("connection closed")
        self.buf += data

    def _line(self):
        while True:
            i = self.buf.find(b"\r\n")
            if i >= 0:
                line = bytes(self.buf[:i])
                del self.buf[: i + 2]
                return line
            self._fill()

    def reply(self):
        line = self._line()
        kind, rest = line[:1], line[1:]
        if kind in (b"+", b"-"):
            return line
        if kind == b":":
            return int(rest)
        if kind == b"$":
            n = int(rest)
            if n < 0:
                return None
            while len(self.buf) < n + 2:
                self._fill()
            value = bytes(self.buf[:n])
            del self.buf[: n + 2]
            return value
        raise ValueError("unexpected reply %r" % line[:40])


def ping(port, n):
    s = connect(port)
    r = Reader(s)
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        s.sendall(command("PING"))
        assert r.reply() == b"+PONG"
        times.append((time.perf_counter() - t0) * 1e3)
    s.close()
    print("%.3f %.3f %.3f" % (min(times), statistics.median(times), max(times)))


def pipeline(port):
    s = connect(port)
    r = Reader(s)
    s.sendall(command("DEL", "proxy:n") + b"".join(command("INCR", "proxy:n") for _ in range(2000)))
    r.reply()
    for i in range(1, 2001):
        got = r.reply()
        if got != i:
            print("INCR %d answered %r" % (i, got))
            return
    values = [os.urandom(1 << 20) for _ in range(32)]
    s.sendall(b"".join(command("SET", "proxy:v%d" % i, v) for i, v in enumerate(values)))
    for i in range(32):
        got = r.reply()
        if got != b"+OK":
            print("SET %d answered %r" % (i, got))
            return
    s.sendall(b"".join(command("GET", "proxy:v%d" % i) for i in range(32)))
    for i, v in enumerate(values):
        if r.reply() != v:
            print("GET %d differs from what was set" % i)
            return
    s.close()
    print("ok")


def name(port):
    s = connect(port)
    r = Reader(s)
    s.sendall(command("CLIENT", "SETNAME", "proxytest"))
    assert r.reply() == b"+OK"
    s.close()
    print("ok")


def closed(port):
    s = connect(port)
    r = Reader(s)
    s.sendall(command("CLIENT", "SETNAME", "proxytest"))
    assert r.reply() == b"+OK"
    print("named", flush=True)
    t0 = time.perf_counter()
    s.settimeout(10)
    try:
        while s.recv(4096):
            pass
        print("closed after %.3f s" % (time.perf_counter() - t0))
    except socket.timeout:
        print("still open")


def flood(proxy, delay_us):
    """Bytes the proxy takes from a client while its target reads nothing,
    and the proxy's peak resident memory (VmHWM)."""
    sink = socket.socket()
    sink.bind(("127.0.0.1", 0))
    sink.listen(1)  # connections complete in the backlog; nothing is read
    with tempfile.TemporaryDirectory() as tmp:
        pfile = os.path.join(tmp, "port")
        proc = subprocess.Popen([proxy, "--listen", "0", "--to",
                                 "127.0.0.1:%d" % sink.getsockname()[1],
                                 "--delay-us", str(delay_us), "--port-file", pfile],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            for _ in range(100):
                if os.path.exists(pfile):
                    break
                time.sleep(0.05)
            s = connect(int(open(pfile).read()))
            s.setblocking(False)
            block, sent, last = b"x" * (1 << 20), 0, time.monotonic()
            end = last + 20
            while time.monotonic() < end and time.monotonic() - last < 1.0:
                try:
                    sent += s.send(block)
                    last = time.monotonic()
                except BlockingIOError:
                    time.sleep(0.01)
            with open("/proc/%d/status" % proc.pid) as f:
                hwm = [line.split()[1] for line in f if line.startswith("VmHWM:")][0]
            s.close()
        finally:
            proc.terminate()
            proc.wait()
        print("%d accepted, proxy peak %s KiB, exit %d" % (sent, hwm, proc.returncode))


if __name__ == "__main__":
    cmd, args = sys.argv[1], sys.argv[2:]
    if cmd == "ping":
        ping(int(args[0]), int(args[1]))
    elif cmd == "pipeline":
        pipeline(int(args[0]))
    elif cmd == "name":
        name(int(args[0]))
    elif cmd == "closed":
        closed(int(args[0]))
    elif cmd == "flood":
        flood(args[0], int(args[1]))
    else:
        sys.exit("unknown command " + cmd)
