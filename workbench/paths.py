"""Where the package, its shipped configs and its checkout are on disk.

One place, so that a module can move between folders without its paths
changing: every ``__file__``-relative path in the package starts here.
"""

from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent
# The checkout of an editable install (``make env``): the home of ``.venv-maxtext``, ``runs/`` and git.
CHECKOUT = PACKAGE_DIR.parent
# The shipped configs (package data); ``configs/`` at the checkout's top is a link to this folder.
CONFIG_DIR = PACKAGE_DIR / "configs"
