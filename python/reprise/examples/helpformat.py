"""The demos' command lines: the ``--help`` layout (option help wrapped without breaking
words at hyphens, ``--min-replay``, ``reprise-runs``; the description and epilog kept as
written), each option's default said once with its presets' values beside it, and presets
(``--smoke``, Atari) applied under the options given explicitly."""

from __future__ import annotations

import argparse
import dataclasses
import textwrap


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    def _split_lines(self, text, width):
        return textwrap.wrap(" ".join(text.split()), width, break_on_hyphens=False)


def _shown(value) -> str:
    return f"{value:g}" if isinstance(value, float) else f"{value}"


def default_note(value, name: str, presets) -> str:
    """``(default: X; P: Y; ...)``: ``value``, then the value of every ``(label, preset)``
    in ``presets`` that sets option ``name``."""
    text = f"(default: {_shown(value)}"
    for label, preset in presets:
        if name in preset:
            text += f"; {label}: {_shown(preset[name])}"
    return text + ")"


def demo_parser(prog: str, description: str, epilog: str, defaults, note):
    """``(parser, option)``: a demo's ``ArgumentParser`` and ``option(flag, help, shown=None,
    **kw)``, which adds ``--flag`` with its default from ``defaults`` (a config instance) and a
    help that ends in ``note(name, shown)`` (the default, once; no
    ArgumentDefaultsHelpFormatter: it would add a second one, or ``None``)."""
    parser = argparse.ArgumentParser(prog=prog, description=description, epilog=epilog,
                                     formatter_class=HelpFormatter)

    def option(flag, help, shown=None, **kw):
        name = flag[2:].replace("-", "_")
        parser.add_argument(flag, default=getattr(defaults, name), help=f"{help} {note(name, shown)}", **kw)

    return parser, option


def parsed_values(args: argparse.Namespace, config_type, presets) -> dict:
    """The ``config_type`` fields found in ``args``, with each preset of ``presets`` (in
    order) applied to the options still at their defaults: an explicit option wins over a
    preset. Give only the presets that apply (``--smoke`` given, an Atari environment)."""
    defaults = config_type()
    values = {f.name: getattr(args, f.name) for f in dataclasses.fields(config_type) if hasattr(args, f.name)}
    for preset in presets:
        for name, value in preset.items():
            if values.get(name, getattr(defaults, name)) == getattr(defaults, name):
                values[name] = value
    return values


def add_dashboard_and_smoke(parser, what: str, smoke_help: str) -> None:
    """The two switches every server-backed demo has: ``--dashboard [ADDRESS]`` (serve
    ``what``'s live dashboard) and ``--smoke`` (``smoke_help``)."""
    parser.add_argument("--dashboard", nargs="?", const="127.0.0.1:0", default=None, metavar="ADDRESS",
                        help=f"serve {what} live dashboard and print its URL; ADDRESS host:port "
                             "(default: off; with no ADDRESS: a free loopback port)")
    parser.add_argument("--smoke", action="store_true", default=False,
                        help=f"{smoke_help}: the --smoke values above (default: off)")
