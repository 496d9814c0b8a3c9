#!/usr/bin/env bash
# report_check.sh REPORT_HTML OUTDIR CHARTS DATASETS
#
# Loads freshet compare's report.html (a file: self-contained, Chart.js
# inlined) in headless Debian chromium, as dashboard_check.sh loads the
# dashboard (chromium_page.py judges the page's own errors), and checks:
#   - no page error (console.error / assert, uncaught exception, failed request,
#     error-level browser log entry);
#   - Chart.js ran and exactly CHARTS charts exist, each with DATASETS datasets
#     (a line per mode) and every dataset with at least 2 points;
#   - OUTDIR/report.png: a 1400x2200 screenshot (written even when a check
#     fails), OUTDIR/chromium.log: chromium's own stderr (never judged).
#
# Exit status: 0 all checks passed, 1 a check failed, 2 bad usage.
# Environment: CHROMIUM (default /usr/bin/chromium).
set -euo pipefail

if [ $# -ne 4 ]; then
    echo "usage: $0 REPORT_HTML OUTDIR CHARTS DATASETS" >&2
    exit 2
fi
CHROMIUM="${CHROMIUM:-/usr/bin/chromium}"
if [ ! -x "$CHROMIUM" ]; then
    echo "report_check: FAIL: $CHROMIUM not found or not executable" >&2
    exit 1
fi
mkdir -p "$2"

exec /usr/bin/python3 - "file://$(realpath "$1")" "$2" "$3" "$4" "$CHROMIUM" "$(dirname "$0")" <<'PY'
import os, sys

sys.path.insert(0, sys.argv[6])
import chromium_page as cp
from chromium_page import Fatal, say

url, outdir, charts, datasets = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
cp.chromium, cp.W, cp.H, cp.NAME = sys.argv[5], 1400, 2200, "report_check"

PROBE = """(function () {
  var have = typeof Chart !== 'undefined';
  var charts = have ? Object.values(Chart.instances).map(function (c) {
    return {id: c.canvas.id, datasets: c.data.datasets.map(function (d) {
      return {label: d.label, points: d.data.length}; })}; }) : [];
  return JSON.stringify({chartjs: have, charts: charts,
                         verdict: document.querySelectorAll('#verdict p').length,
                         tables: document.querySelectorAll('#cells table').length});
})()"""


def main():
    failures = []
    log_path = os.path.join(outdir, "chromium.log")
    b = cp.Browser(log_path)
    b.on_event = cp.on_event
    seen = None
    try:
        try:
            b.call("Browser.getVersion", timeout=cp.T_START)
        except Fatal as e:
            raise Fatal("chromium did not start: %s; see %s" % (e, log_path))
        cp.open_page(b, url)
        b.pump(0.5)  # errors of the page's script
        seen = cp.evaluate_json(b, PROBE)
        cp.screenshot(b, os.path.join(outdir, "report.png"))
        b.pump(0.0)
    except Fatal as e:
        failures.append(str(e))
    finally:
        b.close()
    if seen is not None:
        say("found: chartjs=%s, %d chart(s): %s; %d table(s), %d verdict line(s)" % (
            seen["chartjs"], len(seen["charts"]),
            ", ".join("%s %d" % (c["id"], len(c["datasets"])) for c in seen["charts"]),
            seen["tables"], seen["verdict"]))
        if not seen["chartjs"]:
            failures.append("Chart.js is not in the page")
        if len(seen["charts"]) != charts:
            failures.append("%d charts, want %d" % (len(seen["charts"]), charts))
        for c in seen["charts"]:
            if len(c["datasets"]) != datasets:
                failures.append("%s: %d datasets, want %d" % (c["id"], len(c["datasets"]), datasets))
            for d in c["datasets"]:
                if d["points"] < 2:
                    failures.append("%s: dataset %s has %d point(s)" % (c["id"], d["label"], d["points"]))
        if seen["verdict"] == 0:
            failures.append("no verdict in the page")
    failures += cp.page_errors()
    if failures:
        for f in failures:
            say("FAIL: " + f)
        return 1
    say("OK: %d charts of %d datasets, no page errors" % (charts, datasets))
    return 0


sys.exit(main())
PY
