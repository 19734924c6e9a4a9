#!/usr/bin/env bash
# Refreshes the README's dashboard screenshot (docs/img/dashboard.png), on purpose and only here:
# runs the browser test, which writes its screenshots under test-artifacts/ (git-ignored), and
# copies the one taken mid-recovery (replica 1 just killed from its button) over the tracked image.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-.venv/bin/python}"
rm -f test-artifacts/dashboard.png
"$PY" -m pytest -q tests/browser/test_dashboard_browser.py "$@"
cp test-artifacts/dashboard.png docs/img/dashboard.png
echo "docs/img/dashboard.png refreshed from test-artifacts/dashboard.png"
