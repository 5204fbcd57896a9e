"""``python -m reprise.examples.gpu``: the same program as ``reprise demo gpu``."""

import sys

from .run import main

if __name__ == "__main__":
    sys.exit(main())
