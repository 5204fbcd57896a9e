"""``python -m reprise.examples.offline`` (also under torchrun): the same program as
``reprise demo offline``."""

import sys

from .run import main

if __name__ == "__main__":
    sys.exit(main())
