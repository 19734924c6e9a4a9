#!/usr/bin/env bash
# Refreshes docs/img/titan-dashboard-mid-heal-1440.png, on purpose and only here: runs the browser
# test that kills a TorchTitan group from the dashboard's button and screenshots its tile healing
# (under test-artifacts/, git-ignored), and copies that screenshot over the tracked image.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-.venv/bin/python}"
rm -f test-artifacts/titan-dashboard-mid-heal-1440.png
"$PY" -m pytest -q -s tests/browser/test_titan_dashboard_browser.py "$@"
cp test-artifacts/titan-dashboard-mid-heal-1440.png docs/img/titan-dashboard-mid-heal-1440.png
echo "docs/img/titan-dashboard-mid-heal-1440.png refreshed from test-artifacts/"
