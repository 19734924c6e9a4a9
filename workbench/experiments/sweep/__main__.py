"""``python -m workbench.experiments.sweep SWEEP_DIR``: run the sweep controller of SWEEP_DIR (see ``controller.py``)."""

import sys

from workbench.experiments.sweep.runner import main

sys.exit(main())
