#!/usr/bin/env bash
# Create MaxText's own environment, .venv-maxtext, the way it would run in its own container:
# the job wrapper (workbench/trainers/maxtext/job.py, main environment) starts this interpreter.
#
# maxtext needs Python >= 3.12 and its wheel declares no requirements, so the complete set is
# frozen in requirements-maxtext.txt and installed with --no-deps (no resolver, no surprises).
# Idempotent: does nothing when the environment was built from this very requirements file
# (a stamp holds its hash) and still imports; a change of pins rebuilds it.
#
# Environment:
#   MAXTEXT_VENV        where to create it            (default: <repo>/.venv-maxtext)
#   MAXTEXT_PYTHON      a Python >= 3.12 to build it   (default: pyenv's 3.12.1, else python3.12)
#   MAXTEXT_JAX_EXTRA   cpu (default) or cuda12: on GPU nodes, adds jax[cuda12] at the pinned jax
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${MAXTEXT_VENV:-$repo/.venv-maxtext}"
reqs="$repo/requirements-maxtext.txt"
extra="${MAXTEXT_JAX_EXTRA:-cpu}"
probe="import maxtext.trainers.pre_train.train, jax; print(jax.__version__)"
stamp="$venv/.requirements.sha256"
want="$(sha256sum "$reqs" | cut -d' ' -f1) $extra"

case "$extra" in
    cpu|cuda12) ;;
    *) echo "setup-maxtext: MAXTEXT_JAX_EXTRA=$extra; allowed: cpu, cuda12" >&2; exit 2 ;;
esac

if [ -x "$venv/bin/python" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$want" ] \
    && "$venv/bin/python" -c "import maxtext, jax" >/dev/null 2>&1; then
    echo "setup-maxtext: $venv already works"
    exit 0
fi

python="${MAXTEXT_PYTHON:-}"
if [ -z "$python" ]; then
    if command -v pyenv >/dev/null 2>&1 && pyenv prefix 3.12.1 >/dev/null 2>&1; then
        python="$(pyenv prefix 3.12.1)/bin/python3.12"
    else
        python="$(command -v python3.12 || true)"
    fi
fi
if [ -z "$python" ] || ! "$python" -c 'import sys; assert sys.version_info >= (3, 12)' 2>/dev/null; then
    echo "setup-maxtext: needs Python >= 3.12 (set MAXTEXT_PYTHON, or: pyenv install 3.12.1)" >&2
    exit 1
fi

echo "setup-maxtext: creating $venv with $("$python" --version)"
rm -rf "$venv"
"$python" -m venv "$venv"
"$venv/bin/python" -m pip install -q --upgrade pip
"$venv/bin/python" -m pip install -q --no-deps -r "$reqs"
if [ "$extra" = cuda12 ]; then
    jax_version="$(sed -n 's/^jax==//p' "$reqs")"
    "$venv/bin/python" -m pip install -q "jax[cuda12]==$jax_version"
fi
"$venv/bin/python" -m pip check
JAX_PLATFORMS=cpu "$venv/bin/python" -c "$probe" >/dev/null
echo "$want" > "$stamp"
echo "setup-maxtext: ready in $venv"
