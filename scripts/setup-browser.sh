#!/usr/bin/env bash
# Installs what tests/browser needs, idempotently: Debian's chromium and the pinned
# pip packages (JupyterLab, Playwright's Python package) into the project's venv.
# Playwright drives /usr/bin/chromium; `playwright install` is never run.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-.venv/bin/python}"

if ! command -v chromium >/dev/null 2>&1; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q
    apt-get install -y -q --no-install-recommends chromium fonts-dejavu-core
fi

if ! "$PY" - <<'PY' 2>/dev/null
import importlib.metadata as m, sys
want = {}
for line in open("requirements-browser.txt"):
    line = line.split("#")[0].strip()
    if line:
        name, _, version = line.partition("==")
        want[name] = version
sys.exit(any(m.version(n) != v for n, v in want.items()))
PY
then
    "$PY" -m pip install -q -r requirements-browser.txt
fi

# `make lab` opens with no pop-ups: JupyterLab asks "Would you like to get notified about official
# Jupyter news?" whenever the fetchNews setting is unset, news URL or not; this environment's
# defaults (overrides.json, which a user's own settings still override) answer it.
"$PY" - <<'PY'
import json, pathlib, sys
path = pathlib.Path(sys.prefix) / "share" / "jupyter" / "lab" / "settings" / "overrides.json"
data = json.loads(path.read_text()) if path.exists() else {}
data.setdefault("@jupyterlab/apputils-extension:notification", {}).update({"fetchNews": "false", "checkForUpdates": False})
path.parent.mkdir(parents=True, exist_ok=True)
path.write_text(json.dumps(data, indent=2) + "\n")
PY

chromium --version
"$PY" -c "import playwright, jupyterlab; print('jupyterlab', jupyterlab.__version__)"
