"""On PYTHONPATH of a demo run that a test interrupts while it draws its plot: importing
matplotlib takes 10 s longer, so that the signal lands in the plot phase however fast the
machine is (without it, a fast machine can finish the plot before the signal arrives)."""

import importlib.abc
import sys
import time


class _SlowMatplotlib(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name == "matplotlib":
            sys.meta_path.remove(self)
            time.sleep(10)
        return None


sys.meta_path.insert(0, _SlowMatplotlib())
