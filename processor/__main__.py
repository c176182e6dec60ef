"""``python -m processor``: the ``tokenfabric`` command, for a checkout without the console script."""

import sys

from processor.cli import main

sys.exit(main())
