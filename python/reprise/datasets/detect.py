"""Which format a path holds, from its content (never its name alone), and the reader that
opens it."""

from __future__ import annotations

import os
from pathlib import Path

from ..errors import InvalidArgument, NotFound
from .d4rl import D4RLReader
from .minari import MinariReader, minari_main, minari_root
from .npz import NpzReader
from .source import EXPECTED, import_h5py, open_hdf5

FORMATS = ("d4rl", "minari", "npz")
READERS = {"d4rl": D4RLReader, "minari": MinariReader, "npz": NpzReader}
_HDF5_MAGIC = b"\x89HDF\r\n\x1a\n"
_ZIP_MAGIC = (b"PK\x03\x04", b"PK\x05\x06")


def _sniff(path: Path) -> str:
    try:
        with open(path, "rb") as f:
            head = f.read(8)
    except OSError as e:
        raise InvalidArgument(f"{path}: cannot be read ({e})") from None
    if head[:4] in _ZIP_MAGIC:
        return "npz"
    hdf5 = head == _HDF5_MAGIC
    if not hdf5 and path.suffix.lower() in (".hdf5", ".h5"):
        hdf5 = import_h5py().is_hdf5(path)  # an HDF5 file may start after a user block
    if not hdf5:
        raise InvalidArgument(f"{path}: neither an HDF5 nor an npz file (it begins {head!r}); {EXPECTED}")
    with open_hdf5(path) as f:
        keys = list(f)
        episodic = bool(keys) and all(k.startswith("episode_") and k[8:].isdigit() for k in keys)
    return "minari" if episodic else "d4rl"


def resolve(path) -> tuple[str, Path]:
    """``(format, file)``: what ``path`` holds and the file to read."""
    try:
        p = Path(os.fspath(path)).expanduser()
    except TypeError:
        raise InvalidArgument(f"path must be a str or os.PathLike, got {path!r}") from None
    if p.is_dir():
        return "minari", minari_main(p)
    if p.is_file():
        return _sniff(p), p
    if p.exists():
        raise InvalidArgument(f"{p}: not a regular file or directory; {EXPECTED}")
    if p.is_absolute():
        raise NotFound(f"{p}: no such file or directory")
    by_id = minari_root() / os.fspath(path)
    if by_id.is_dir():
        return "minari", minari_main(by_id)
    raise NotFound(f"{p}: no such file or directory, and no Minari dataset of that id under {minari_root()}")


def open_reader(path, format: str | None):
    """The reader of ``path``; ``format``, when not None, must be what it holds."""
    if format is not None and format not in FORMATS:
        raise InvalidArgument(f"format must be one of {', '.join(FORMATS)} or None, got {format!r}")
    kind, file = resolve(path)
    if format is not None and format != kind:
        raise InvalidArgument(f"{file}: asked to read it as {format}, but its content is {kind}")
    return READERS[kind](file)


def detect_format(path) -> str:
    """``"d4rl"``, ``"minari"`` or ``"npz"``: what ``path`` holds, from its content
    (a Minari dataset id is looked up on disk, never downloaded)."""
    return resolve(path)[0]
