#!/usr/bin/env bash
# What `make demo` (check-setup.sh demo) and `make test` (check-setup.sh test) need from the
# machine before they install anything: the first thing missing, in one line naming it and how
# to get it, and exit 1. Nothing is installed here.
#
# Environment: PYTHON (the interpreter make builds .venv with), MAXTEXT_PYTHON (see setup-maxtext.sh).
set -uo pipefail
cd "$(dirname "$0")/.."
what="${1:-demo}"
py="${PYTHON:-python3}"

fail() { echo "make $what: $*" >&2; exit 1; }

"$py" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null \
    || fail "needs a Python >= 3.11 as PYTHON (now '$py'); Debian/Ubuntu: apt-get install python3, or PYTHON=/path/to/python3.11"
[ -x .venv/bin/python ] || "$py" -c 'import ensurepip, venv' 2>/dev/null \
    || fail "$py cannot create a virtual environment; Debian/Ubuntu: apt-get install python3-venv"
[ "$what" = demo ] && exit 0

# MaxText's environment: the same interpreter choice as scripts/setup-maxtext.sh.
if ! { [ -x .venv-maxtext/bin/python ] && .venv-maxtext/bin/python -c 'import maxtext' 2>/dev/null; }; then
    mx="${MAXTEXT_PYTHON:-}"
    if [ -z "$mx" ]; then
        if command -v pyenv >/dev/null 2>&1 && pyenv prefix 3.12.1 >/dev/null 2>&1; then
            mx="$(pyenv prefix 3.12.1)/bin/python3.12"
        else
            mx="$(command -v python3.12 || true)"
        fi
    fi
    [ -z "${MAXTEXT_PYTHON:-}" ] || "$mx" -c 'import sys; sys.exit(sys.version_info < (3, 12))' 2>/dev/null \
        || fail "MAXTEXT_PYTHON=$mx is not a Python >= 3.12"
    [ -n "$mx" ] && "$mx" -c 'import sys; sys.exit(sys.version_info < (3, 12))' 2>/dev/null \
        || fail "MaxText needs a Python >= 3.12 and there is none (no python3.12 on PATH, no pyenv 3.12.1); Debian 13/Ubuntu 24.04: apt-get install python3.12 python3.12-venv, elsewhere: pyenv install 3.12.1, or MAXTEXT_PYTHON=/path/to/python3.12"
    "$mx" -c 'import ensurepip, venv' 2>/dev/null \
        || fail "$mx cannot create a virtual environment; Debian/Ubuntu: apt-get install python3.12-venv"
fi

# Debian packages the tests use (Slurm, MariaDB, munge, chromium): present, or apt-get as root.
need_apt=0
for bin in slurmctld slurmd slurmdbd munged mariadbd chromium; do
    command -v "$bin" >/dev/null 2>&1 || [ -x "/usr/sbin/$bin" ] || need_apt=1
done
if [ "$need_apt" = 1 ]; then
    command -v apt-get >/dev/null 2>&1 \
        || fail "the tests need Debian's slurm-wlm, slurmdbd, munge, mariadb-server and chromium, and there is no apt-get; install them with your package manager"
    [ "$(id -u)" -eq 0 ] || command -v sudo >/dev/null 2>&1 \
        || fail "installing slurm-wlm, slurmdbd, munge, mariadb-server and chromium needs root (or sudo): run make test as root"
fi
exit 0
