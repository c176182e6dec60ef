"""The ``tokenfabric`` command: one module per subcommand and the options they share.

The top of the import order: it may import every package, and no package imports it.
Public face: :func:`main` (from ``tokenfabric``, the console script).
"""

from processor.cli.tokenfabric import main

__all__ = ["main"]
