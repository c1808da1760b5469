#!/usr/bin/env bash
# Render a `sluice audit` HTML report in headless Chromium and save a PNG,
# to check by eye that the page and its inline SVG plots render.
#
#   benchmarks/audit_screenshot.sh [REPORT.html] [OUT.png]
#
# Without REPORT.html it first makes one: a compare-mode audit of two scripted
# servers from the test suite (tests/broken_servers.py), a correct one (A) and
# one with the delta-aliasing bug (B), so the page shows findings and ratios.
# Needs /usr/bin/chromium (apt-get install -y chromium).
set -euo pipefail
cd "$(dirname "$0")/.."
report=${1:-}
out=${2:-docs/audit_report.png}
command -v chromium >/dev/null || { echo "chromium not found (apt-get install -y chromium)" >&2; exit 2; }
if [ -z "$report" ]; then
    report=$(mktemp --suffix=.html)
    .venv/bin/python - "$report" <<'PY' || true  # exit status 1 = findings, expected here
import sys

from sluice.audit.cli import main
from tests.broken_servers import MODEL, Defect, serving

with serving(Defect.NONE) as url_a, serving(Defect.ALIASING) as url_b:
    sys.exit(main(["--compare", url_a, url_b, "--model", MODEL, "--html", sys.argv[1], "--quiet"]))
PY
fi
profile=$(mktemp -d)
trap 'rm -rf "$profile"' EXIT
chromium --headless --no-sandbox --disable-gpu --disable-quic --no-first-run \
    --disable-background-networking --disable-component-update --disable-sync \
    --user-data-dir="$profile" --screenshot="$out" --window-size=1280,2000 \
    "file://$(realpath "$report")" 2>/dev/null
# A PNG file starts with \x89PNG.
head -c 4 "$out" | grep -q PNG && echo "screenshot: $out"
