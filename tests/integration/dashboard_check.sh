#!/usr/bin/env bash
# dashboard_check.sh URL OUTDIR MIN_POINTS
#
# Loads the freshet dashboard (serve/dashboard.html, GET /dashboard) in headless
# Debian chromium and checks it the way an operator would see it:
#   - no console.error / console.assert, no uncaught exception (incl. unhandled
#     promise rejections), no failed request of the page (network error, HTTP
#     status >= 400, blocked or timed-out fetch), no error-level browser log entry
#     attributed to the page;
#   - after the page has refreshed (its #updated[data-refreshes] counter >= 2, or
#     DASHBOARD_WAIT_S seconds after load), <span id="points"> holds an integer
#     >= MIN_POINTS and #store-status does not have class "down";
#   - OUTDIR/dashboard.png: a 1400x2200 screenshot (written even when a check
#     fails), OUTDIR/chromium.log: chromium's own stderr (never judged).
#
# Chromium is driven over the DevTools protocol on --remote-debugging-pipe
# (NUL-separated JSON on fds 3/4), so only events of the page's own target are
# judged: chromium's internal noise on stderr (dbus, GPU, Fontconfig, ...) is
# ignored. Needs only bash, /usr/bin/chromium and the python3 standard library.
#
# Exit status: 0 all checks passed, 1 a check failed or chromium could not
# load the page, 2 bad usage.
# Environment: CHROMIUM (default /usr/bin/chromium), DASHBOARD_WAIT_S (default
# 8: longest wait for refreshes after the load event).
set -euo pipefail

if [ $# -ne 3 ]; then
    echo "usage: $0 URL OUTDIR MIN_POINTS" >&2
    exit 2
fi
case "$3" in
    ''|*[!0-9]*) echo "dashboard_check: MIN_POINTS must be a non-negative integer, got '$3'" >&2; exit 2 ;;
esac
CHROMIUM="${CHROMIUM:-/usr/bin/chromium}"
if [ ! -x "$CHROMIUM" ]; then
    echo "dashboard_check: FAIL: $CHROMIUM not found or not executable" >&2
    exit 1
fi
mkdir -p "$2"

exec /usr/bin/python3 - "$1" "$2" "$3" "$CHROMIUM" "${DASHBOARD_WAIT_S:-8}" <<'PY'
import base64, fcntl, json, os, select, shutil, subprocess, sys, tempfile, time

url, outdir, min_points, chromium, wait_s = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], float(sys.argv[5])
W, H = 1400, 2200
T_START = 30.0      # chromium start-up + first answer
T_LOAD = 20.0       # navigation until the load event
T_CALL = 15.0       # any single protocol call


def say(msg):
    print("dashboard_check: " + msg, flush=True)


class Fatal(Exception):
    pass


class Browser:
    """Minimal DevTools client over --remote-debugging-pipe (fd 3: commands in, fd 4: replies out)."""

    def __init__(self, log_path):
        self.profile = tempfile.mkdtemp(prefix="dashboard_check.")
        self.cmd = [chromium, "--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run",
                    "--no-default-browser-check", "--user-data-dir=" + self.profile,
                    "--remote-debugging-pipe", "--window-size=%d,%d" % (W, H), "--hide-scrollbars",
                    "--mute-audio", "--disable-extensions", "--disable-sync", "--disable-component-update",
                    "--disable-background-networking", "--disable-default-apps", "about:blank"]
        cmd_r, self.cmd_w = os.pipe()
        self.out_r, out_w = os.pipe()

        def child_fds():
            # move both ends out of the way first, then put them on 3 and 4
            a = fcntl.fcntl(cmd_r, fcntl.F_DUPFD, 20)
            b = fcntl.fcntl(out_w, fcntl.F_DUPFD, 20)
            os.dup2(a, 3)
            os.dup2(b, 4)

        self.log = open(log_path, "wb")
        self.proc = subprocess.Popen(self.cmd, stdin=subprocess.DEVNULL, stdout=self.log, stderr=self.log,
                                     preexec_fn=child_fds, pass_fds=(3, 4), start_new_session=True)
        os.close(cmd_r)
        os.close(out_w)
        self.buf = b""
        self.next_id = 0
        self.replies = {}
        self.on_event = lambda msg: None

    def send(self, method, params=None, session=None):
        self.next_id += 1
        msg = {"id": self.next_id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        data = json.dumps(msg).encode() + b"\0"
        while data:
            n = os.write(self.cmd_w, data)
            data = data[n:]
        return self.next_id

    def pump(self, timeout):
        """Reads whatever arrives within timeout seconds; dispatches events, stores replies."""
        r, _, _ = select.select([self.out_r], [], [], max(0.0, timeout))
        if not r:
            return
        chunk = os.read(self.out_r, 1 << 20)
        if not chunk:
            raise Fatal("chromium closed the DevTools pipe (exit status %s)" % self.proc.poll())
        self.buf += chunk
        while b"\0" in self.buf:
            raw, self.buf = self.buf.split(b"\0", 1)
            msg = json.loads(raw)
            if "id" in msg:
                self.replies[msg["id"]] = msg
            else:
                self.on_event(msg)

    def call(self, method, params=None, session=None, timeout=T_CALL):
        i = self.send(method, params, session)
        end = time.monotonic() + timeout
        while i not in self.replies:
            left = end - time.monotonic()
            if left <= 0:
                raise Fatal("no answer to %s within %.0f s" % (method, timeout))
            self.pump(left)
        msg = self.replies.pop(i)
        if "error" in msg:
            raise Fatal("%s failed: %s" % (method, msg["error"].get("message", msg["error"])))
        return msg.get("result", {})

    def close(self):
        try:
            if self.proc.poll() is None:
                self.send("Browser.close")
                self.proc.wait(timeout=5)
        except Exception:
            pass
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        for fd in (self.cmd_w, self.out_r):
            try:
                os.close(fd)
            except OSError:
                pass
        self.log.close()
        shutil.rmtree(self.profile, ignore_errors=True)


def remote_text(o):
    if not isinstance(o, dict):
        return str(o)
    if "value" in o:
        return o["value"] if isinstance(o["value"], str) else json.dumps(o["value"])
    return o.get("description") or o.get("unserializableValue") or o.get("type", "?")


def where(url, line):
    return " (%s:%s)" % (url, line + 1 if isinstance(line, int) else "?") if url else ""


problems = []           # page errors, in arrival order
net_failed_urls = set() # requests already reported through the Network domain
log_network = []        # Log.entryAdded network errors, kept only if Network did not report that URL
requests = {}
state = {"loaded": False, "session": None}


def on_event(msg):
    if msg.get("sessionId") != state["session"]:
        return
    m, p = msg.get("method"), msg.get("params", {})
    if m == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
        fr = (p.get("stackTrace") or {}).get("callFrames") or [{}]
        problems.append("console.%s: %s%s" % (p["type"], " ".join(remote_text(a) for a in p.get("args", [])),
                                               where(fr[0].get("url"), fr[0].get("lineNumber"))))
    elif m == "Runtime.exceptionThrown":
        d = p.get("exceptionDetails", {})
        desc = remote_text(d["exception"]) if d.get("exception") else d.get("text", "exception")
        problems.append("uncaught exception: %s%s" % (desc.splitlines()[0] if desc else d.get("text"),
                                                      where(d.get("url"), d.get("lineNumber"))))
    elif m == "Log.entryAdded":
        e = p.get("entry", {})
        if e.get("level") == "error":
            if e.get("source") == "network":
                log_network.append((e.get("url"), "browser log: %s (%s)" % (e.get("text"), e.get("url"))))
            else:
                problems.append("browser log [%s]: %s%s" % (e.get("source"), e.get("text"),
                                                            where(e.get("url"), e.get("lineNumber"))))
    elif m == "Network.requestWillBeSent":
        requests[p.get("requestId")] = p.get("request", {}).get("url", "?")
    elif m == "Network.responseReceived":
        r = p.get("response", {})
        if r.get("status", 0) >= 400:
            net_failed_urls.add(r.get("url"))
            problems.append("failed request: HTTP %s %s for %s" % (r.get("status"), r.get("statusText", ""), r.get("url")))
    elif m == "Network.loadingFailed":
        u = requests.get(p.get("requestId"), "?")
        if u not in net_failed_urls:   # an HTTP error status was already reported above
            net_failed_urls.add(u)
            why = p.get("blockedReason") or p.get("corsErrorStatus", {}).get("corsError") or p.get("errorText")
            problems.append("failed request: %s%s for %s" % (why, " (canceled)" if p.get("canceled") else "", u))
    elif m == "Page.loadEventFired":
        state["loaded"] = True


PROBE = """(function () {
  var p = document.getElementById('points'), s = document.getElementById('store-status'),
      u = document.getElementById('updated');
  return JSON.stringify({points: p ? p.textContent.trim() : null, status_class: s ? s.className : null,
                         status_text: s ? s.textContent.trim() : null,
                         refreshes: u && u.dataset.refreshes !== undefined ? Number(u.dataset.refreshes) : null});
})()"""


def probe(b):
    r = b.call("Runtime.evaluate", {"expression": PROBE, "returnByValue": True}, state["session"])
    return json.loads(r["result"]["value"])


def main():
    failures = []
    log_path = os.path.join(outdir, "chromium.log")
    b = Browser(log_path)
    b.on_event = on_event
    say("running: " + " ".join(b.cmd))
    shot = os.path.join(outdir, "dashboard.png")
    seen = None
    try:
        try:
            b.call("Browser.getVersion", timeout=T_START)
        except Fatal as e:
            raise Fatal("chromium did not start: %s; see %s" % (e, log_path))
        tid = b.call("Target.createTarget", {"url": "about:blank"})["targetId"]
        state["session"] = b.call("Target.attachToTarget", {"targetId": tid, "flatten": True})["sessionId"]
        s = state["session"]
        for m in ("Page.enable", "Runtime.enable", "Log.enable", "Network.enable"):
            b.call(m, session=s)
        b.call("Network.setCacheDisabled", {"cacheDisabled": True}, s)
        b.call("Emulation.setDeviceMetricsOverride",
               {"width": W, "height": H, "deviceScaleFactor": 1, "mobile": False}, s)
        nav = b.call("Page.navigate", {"url": url}, s, timeout=T_LOAD)
        if nav.get("errorText"):
            raise Fatal("navigation to %s failed: %s" % (url, nav["errorText"]))
        end = time.monotonic() + T_LOAD
        while not state["loaded"]:
            if time.monotonic() > end:
                raise Fatal("no load event within %.0f s" % T_LOAD)
            b.pump(end - time.monotonic())
        # let the page refresh: at least one timed refresh after the first one
        end = time.monotonic() + wait_s
        while True:
            seen = probe(b)
            pts = seen.get("points")
            enough = pts is not None and pts.isdigit() and int(pts) >= min_points
            down = "down" in (seen.get("status_class") or "").split()
            refreshed = seen.get("refreshes") is not None and seen["refreshes"] >= 2
            if (refreshed and (enough or down)) or time.monotonic() > end:
                break
            b.pump(0.25)
        png = b.call("Page.captureScreenshot", {"format": "png"}, s)["data"]
        with open(shot, "wb") as f:
            f.write(base64.b64decode(png))
        say("screenshot: %s" % shot)
        b.pump(0.2)  # late errors of the last refresh
        b.pump(0.0)
    except Fatal as e:
        failures.append(str(e))
    finally:
        b.close()

    for u, text in log_network:
        if u not in net_failed_urls:
            problems.append(text)
    if seen is not None:
        pts, cls = seen.get("points"), seen.get("status_class")
        say("found: points=%s status=%r (class %r) refreshes=%s" % (pts, seen.get("status_text"), cls, seen.get("refreshes")))
        if pts is None:
            failures.append('no <span id="points"> in the page')
        elif not pts.isdigit():
            failures.append("#points is not an integer: %r" % pts)
        elif int(pts) < min_points:
            failures.append("#points is %s, want >= %d" % (pts, min_points))
        if cls is None:
            failures.append("no #store-status element in the page")
        elif "down" in cls.split():
            failures.append("#store-status is down: %s" % seen.get("status_text"))
        if seen.get("refreshes") is not None and seen["refreshes"] < 2:
            failures.append("the page refreshed only %s time(s) in %.0f s" % (seen["refreshes"], wait_s))
    counts = {}
    for p in problems:  # the same failure on every refresh is reported once, with a count
        counts[p] = counts.get(p, 0) + 1
    for p, n in counts.items():
        failures.append("page error: " + p + (" (x%d)" % n if n > 1 else ""))
    if failures:
        for f in failures:
            say("FAIL: " + f)
        return 1
    say("OK: %s points >= %d, store ok, no page errors" % (seen.get("points"), min_points))
    return 0


sys.exit(main())
PY
