"""The ``reprise`` command.

    reprise demo apex [options]       distributed Ape-X DQN on Reprise (CartPole by default)
    reprise demo offline [options]    import a generated dataset, train a Decision Transformer
    reprise demo gpu [options]        vectorised CartPole on the device, a device store, a learner there
    reprise demo grpo [options]       asynchronous GRPO: rollout workers and a trainer, a transformer learns to sort
    reprise import PATH --out DIR     load a D4RL/Minari/npz dataset into a store, save a checkpoint
    reprise serve --config FILE       serve tables over gRPC (stores, tables, address, token, TLS)
    reprise aggregate [--config FILE] the in-network gradient aggregation daemon (UDP; iSwitch)
    reprise info ADDRESS [--json]     one snapshot of a server: tables, rates, priorities, clients
    reprise top ADDRESS               the same, redrawn every second in the terminal (q quits)
    reprise doctor [--json]           versions, GPU, /dev/shm and runtime directory, for bug reports

``reprise <command> --help`` lists each command's options.
"""

from __future__ import annotations

import sys

_USAGE = __doc__.split("\n\n")[1]


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print("usage: reprise <command> ...\n\n" + _USAGE)
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    if command == "demo":
        demos = {"apex": "reprise.examples.apex", "offline": "reprise.examples.offline",
                 "gpu": "reprise.examples.gpu", "grpo": "reprise.examples.grpo"}
        if not rest or rest[0] not in demos:
            print(f"usage: reprise demo {{{','.join(demos)}}} [options]", file=sys.stderr)
            return 2
        import importlib
        return importlib.import_module(demos[rest[0]]).main(rest[1:]) or 0
    if command == "import":
        from .datasets import main as import_main
        return import_main(rest) or 0
    if command == "serve":
        from .server_config import main as serve_main
        return serve_main(rest)
    if command == "aggregate":
        from .aggregate.config import main as aggregate_main
        return aggregate_main(rest)
    if command == "info":
        from .monitor import info_main
        return info_main(rest)
    if command == "top":
        from .monitor import top_main
        return top_main(rest)
    if command == "doctor":
        from .doctor import main as doctor_main
        return doctor_main(rest)
    if command == "--version":
        from . import __version__
        print(__version__)
        return 0
    print(f"reprise: unknown command {command!r}; expected one of demo, import, serve, aggregate, info, top, doctor\n\n{_USAGE}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
