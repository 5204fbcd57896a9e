"""``python -m reprise.examples.grpo``: the same program as ``reprise demo grpo``."""

import sys

from .supervisor import main

if __name__ == "__main__":
    sys.exit(main())
