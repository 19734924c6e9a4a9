"""``python -m workbench.sweep SWEEP_DIR``: run the sweep controller of SWEEP_DIR (see ``controller.py``)."""

import sys

from .controller import main

sys.exit(main())
