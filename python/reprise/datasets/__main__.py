"""``python -m reprise.datasets PATH --out DIR``: the same as ``reprise import``."""

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
