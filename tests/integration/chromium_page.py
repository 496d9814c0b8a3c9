"""chromium_page.py - headless Debian chromium driven over the DevTools protocol on
--remote-debugging-pipe (NUL-separated JSON on fds 3/4), for the page checks
(dashboard_check.sh, report_check.sh): only events of the page's own target are
judged, so chromium's internal noise on stderr (dbus, GPU, Fontconfig, ...) is
ignored. A page error is a console.error / console.assert, an uncaught
exception (incl. unhandled promise rejections), a failed request of the page
(network error, HTTP status >= 400, blocked or timed-out fetch) or an
error-level browser log entry attributed to the page. Standard library only.
"""
import base64, fcntl, json, os, select, shutil, subprocess, sys, tempfile, time

chromium = "/usr/bin/chromium"   # set by the check
W, H = 1400, 2200                 # the window, set by the check
NAME = "page_check"               # the prefix of say(), set by the check
T_START = 30.0      # chromium start-up + first answer
T_LOAD = 20.0       # navigation until the load event
T_CALL = 15.0       # any single protocol call


def say(msg):
    print(NAME + ": " + msg, flush=True)


class Fatal(Exception):
    pass


class Browser:
    """Minimal DevTools client over --remote-debugging-pipe (fd 3: commands in, fd 4: replies out)."""

    def __init__(self, log_path):
        self.profile = tempfile.mkdtemp(prefix=NAME + ".")
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


def open_page(b, url):
    """Attaches to a new target, enables the domains judged, navigates to url and
    waits for the load event; returns the session id."""
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
    return s


def evaluate_json(b, expression):
    """The page's JSON.stringify'd answer to expression, parsed."""
    r = b.call("Runtime.evaluate", {"expression": expression, "returnByValue": True}, state["session"])
    return json.loads(r["result"]["value"])


def screenshot(b, path):
    png = b.call("Page.captureScreenshot", {"format": "png"}, state["session"])["data"]
    with open(path, "wb") as f:
        f.write(base64.b64decode(png))
    say("screenshot: %s" % path)


def page_errors():
    """The page errors seen, each once, with a count when repeated."""
    for u, text in log_network:
        if u not in net_failed_urls:
            problems.append(text)
    counts = {}
    for p in problems:
        counts[p] = counts.get(p, 0) + 1
    return ["page error: " + p + (" (x%d)" % n if n > 1 else "") for p, n in counts.items()]
