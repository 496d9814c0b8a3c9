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
# Chromium is driven by chromium_page.py (beside this script) over the DevTools
# protocol, so only events of the page's own target are judged. Needs only
# bash, /usr/bin/chromium and the python3 standard library.
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

exec /usr/bin/python3 - "$1" "$2" "$3" "$CHROMIUM" "${DASHBOARD_WAIT_S:-8}" "$(dirname "$0")" <<'PY'
import os, sys, time

sys.path.insert(0, sys.argv[6])
import chromium_page as cp
from chromium_page import Fatal, say

url, outdir, min_points, wait_s = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[5])
cp.chromium, cp.W, cp.H, cp.NAME = sys.argv[4], 1400, 2200, "dashboard_check"

PROBE = """(function () {
  var p = document.getElementById('points'), s = document.getElementById('store-status'),
      u = document.getElementById('updated');
  return JSON.stringify({points: p ? p.textContent.trim() : null, status_class: s ? s.className : null,
                         status_text: s ? s.textContent.trim() : null,
                         refreshes: u && u.dataset.refreshes !== undefined ? Number(u.dataset.refreshes) : null});
})()"""


def main():
    failures = []
    log_path = os.path.join(outdir, "chromium.log")
    b = cp.Browser(log_path)
    b.on_event = cp.on_event
    say("running: " + " ".join(b.cmd))
    shot = os.path.join(outdir, "dashboard.png")
    seen = None
    try:
        try:
            b.call("Browser.getVersion", timeout=cp.T_START)
        except Fatal as e:
            raise Fatal("chromium did not start: %s; see %s" % (e, log_path))
        cp.open_page(b, url)
        # let the page refresh: at least one timed refresh after the first one
        end = time.monotonic() + wait_s
        while True:
            seen = cp.evaluate_json(b, PROBE)
            pts = seen.get("points")
            enough = pts is not None and pts.isdigit() and int(pts) >= min_points
            down = "down" in (seen.get("status_class") or "").split()
            refreshed = seen.get("refreshes") is not None and seen["refreshes"] >= 2
            if (refreshed and (enough or down)) or time.monotonic() > end:
                break
            b.pump(0.25)
        cp.screenshot(b, shot)
        b.pump(0.2)  # late errors of the last refresh
        b.pump(0.0)
    except Fatal as e:
        failures.append(str(e))
    finally:
        b.close()

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
    failures += cp.page_errors()  # the same failure on every refresh is reported once, with a count
    if failures:
        for f in failures:
            say("FAIL: " + f)
        return 1
    say("OK: %s points >= %d, store ok, no page errors" % (seen.get("points"), min_points))
    return 0


sys.exit(main())
PY
