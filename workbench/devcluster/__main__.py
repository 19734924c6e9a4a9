import sys

from workbench.devcluster.cli import main

sys.exit(main())
