"""``reprise import PATH --out DIR``: a dataset into a store, saved as a checkpoint."""

from __future__ import annotations

import argparse
import sys

from ..errors import RepriseError
from .dataset import load
from .detect import FORMATS


def main(argv: list[str] | None = None) -> int:
    """``reprise import PATH --out DIR``: loads a dataset, prints what it holds and
    saves its tables as a checkpoint under DIR."""
    p = argparse.ArgumentParser(
        prog="reprise import",
        description="Load a D4RL (HDF5), Minari or npz dataset into a Reprise store and save its tables "
                    "('episodes', and 'windows' with --window) as a checkpoint.")
    p.add_argument("path", help="an .hdf5/.h5 file (D4RL layout), a Minari dataset (directory, "
                                "main_data.hdf5 or id on disk) or an .npz file")
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--out", help="directory for the checkpoint (created if missing)")
    where.add_argument("--file-store", metavar="DIR",
                       help="build a file store in DIR on a local disk instead (for datasets larger than memory): "
                            "rp.Store.open(DIR) maps it again with its tables, copying nothing")
    p.add_argument("--format", choices=FORMATS, help="default: detected from the content")
    p.add_argument("--window", type=int, help="also make a 'windows' table of T-step windows")
    p.add_argument("--fields", help="comma-separated arrays to keep (default: all)")
    p.add_argument("--block-steps", type=int, default=64, help="store block size in steps (default 64)")
    p.add_argument("--compression", choices=("zstd",), help="compress the checkpoint's step data")
    p.add_argument("--seed", type=int, help="seed of the tables' samplers")
    args = p.parse_args(argv)
    fields = None if args.fields is None else [f.strip() for f in args.fields.split(",") if f.strip()]
    from .. import checkpoint
    try:
        file_store = args.file_store is not None
        with load(args.path, format=args.format, window=args.window, fields=fields,
                  block_steps=args.block_steps, seed=args.seed, directory=args.file_store,
                  backing="file" if file_store else "memory") as ds:
            print(ds.describe())
            saved = None if file_store else checkpoint.save(args.out, ds.tables, compression=args.compression)
            names = [t.name for t in ds.tables]
    except (RepriseError, OSError) as e:
        # load's messages name its keyword argument; here the same choice is the --fields option.
        message = str(e).replace("with fields=)", "with --fields)")
        print(f"reprise import: {message}", file=sys.stderr)
        return 2
    if file_store:
        import os
        where = os.path.abspath(args.file_store)
        print(f"\nfile store: {where}\nopen it with:\n"
              f"    import reprise as rp\n"
              f"    store = rp.Store.open({where!r})    # store.tables: {{{', '.join(repr(n) for n in names)}}}\n"
              f"    batch = store.tables[{names[-1]!r}].sample(256)")
        return 0
    print(f"\ncheckpoint: {saved}\nload it with:\n"
          f"    import reprise as rp\n"
          f"    tables = rp.checkpoint.load({saved!r})    # {{{', '.join(repr(n) for n in names)}}}\n"
          f"    batch = tables[{names[-1]!r}].sample(256)")
    return 0
