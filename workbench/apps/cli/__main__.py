"""``python -m workbench.apps.cli``: the ``workbench`` console script."""

import sys

from workbench.apps.cli import main

sys.exit(main())
