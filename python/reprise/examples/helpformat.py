"""The demos' ``--help`` layout: option help wrapped without breaking words at hyphens
(``--min-replay``, ``reprise-runs``), the description and epilog kept as written."""

from __future__ import annotations

import argparse
import textwrap


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    def _split_lines(self, text, width):
        return textwrap.wrap(" ".join(text.split()), width, break_on_hyphens=False)
