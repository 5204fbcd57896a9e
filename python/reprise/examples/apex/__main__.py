"""``python -m reprise.examples.apex``: the same program as ``reprise demo apex``."""

import sys

from .supervisor import main

if __name__ == "__main__":
    sys.exit(main())
