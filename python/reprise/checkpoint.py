"""Checkpoints: ``save(path, tables)`` and ``load(path)``.

A checkpoint is a directory, written under a temporary name next to its final
one and renamed when complete (a crash leaves no partial checkpoint, and the
previous ones intact):

    ckpt-<unix ns>/
      MANIFEST.json        format, version, stores, tables, and a size + CRC-32 per file
      store-<i>.rows       int64 [k, 2]: the (start, count) row runs written, in file order
      store-<i>.col-<j>    column j's rows of those runs, back to back (zstd when asked)
      table-<i>.npz        the table's index: items, slots, orders (numpy arrays)

Saving is online: each table's index is copied under its lock (a moment), and
the blocks it references are pinned, so inserts and samples go on while the rows
are written; rows an item references are never rewritten, so the copy is
consistent. Stores shared by several tables are written once. Loading reads
each file once and checks it as it goes; a truncated, corrupt or other-version
checkpoint raises ``Corrupt`` naming the file, and the stores it had begun are
removed: nothing is loaded.
"""

from __future__ import annotations

import ctypes
import importlib.util
import io
import json
import os
import sys
import time
import zlib
from pathlib import Path

import numpy as np

from . import _native
from .errors import Corrupt, InvalidArgument
from .signature import Field

FORMAT = "reprise-checkpoint"
VERSION = 1
MANIFEST = "MANIFEST.json"
_CHUNK = 64 << 20


class _Progress:
    """A progress bar on a terminal for work that takes more than a second."""

    def __init__(self, total: int, desc: str, enabled: bool | None, unit: str = "B"):
        self._bar = None
        if enabled is None:
            enabled = sys.stderr.isatty()
        if enabled:
            try:
                from tqdm import tqdm
            except ImportError:
                return
            self._bar = tqdm(total=total, desc=desc, unit=unit, unit_scale=True, delay=1.0, leave=False)

    def update(self, n: int):
        if self._bar is not None:
            self._bar.update(n)

    def close(self):
        if self._bar is not None:
            self._bar.close()


class _Out:
    """A file written 0600, with its size and CRC-32, optionally zstd-compressed;
    small writes are gathered into 4 MB writes."""

    BUFFER = 4 << 20
    DIRECT = 64 << 10  # larger writes skip the buffer (no extra copy)

    def __init__(self, path: Path, compression: str | None):
        self.path = path
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        self.crc, self.size = 0, 0
        self._buf = bytearray()
        self._z = None
        if compression == "zstd":
            import zstandard
            self._z = zstandard.ZstdCompressor(level=3).compressobj()

    def _raw(self, data):
        mv = memoryview(data).cast("B")
        self.crc = zlib.crc32(mv, self.crc)
        self.size += len(mv)
        while mv:
            n = os.write(self.fd, mv)
            mv = mv[n:]

    def write(self, data):
        data = memoryview(np.ascontiguousarray(data)).cast("B") if isinstance(data, np.ndarray) else memoryview(data).cast("B")
        if self._z is not None:
            data = self._z.compress(data)
        if len(data) >= self.DIRECT:
            self._flush()
            self._raw(data)
            return
        self._buf += data
        if len(self._buf) >= self.BUFFER:
            self._flush()

    def _flush(self):
        if self._buf:
            self._raw(self._buf)
            self._buf = bytearray()

    def close(self) -> dict:
        if self._z is not None:
            self._buf += self._z.flush()
        self._flush()
        os.fsync(self.fd)
        os.close(self.fd)
        return {"bytes": self.size, "crc32": self.crc}


def _columns_view(store):
    """``[(field, row_bytes, read)]`` where ``read(a, b)`` returns rows [a, b) of the
    field as uint8 ``[b - a, row_bytes]``: views of a host store's shared memory, or
    copies from a device store's GPU columns."""
    if store._device_columns is not None:
        cols = store._device_columns
        torch = __import__("torch")
        if cols.device.type == "cuda":
            torch.cuda.synchronize(cols.device)  # writes recorded on any stream are done

        def device_reader(name):
            view = cols.views[name]
            rb = view.shape[1] * view.element_size()
            return rb, lambda a, b: view[a:b].cpu().numpy().view(np.uint8).reshape(b - a, rb)

        return [(name, *device_reader(name)) for name in cols.fields]
    address, nbytes = store._native.memory()
    buf = np.ctypeslib.as_array((ctypes.c_uint8 * nbytes).from_address(address))
    cap = store.capacity
    out = []
    for name, off, rb in store._native.column_layout():
        view = buf[off:off + cap * rb].reshape(cap, rb)
        out.append((name, rb, lambda a, b, v=view: v[a:b]))
    return out


def _runs(snapshots) -> np.ndarray:
    """The row runs referenced by the items of ``snapshots``, merged, ascending: int64 [k, 2]."""
    starts = np.concatenate([s["range_start"].astype(np.int64) for s in snapshots] or [np.zeros(0, np.int64)])
    ends = starts + np.concatenate([s["range_len"].astype(np.int64) for s in snapshots] or [np.zeros(0, np.int64)])
    if starts.size == 0:
        return np.zeros((0, 2), np.int64)
    order = np.argsort(starts, kind="stable")
    starts, ends = starts[order], ends[order]
    reach = np.maximum.accumulate(ends)
    new = np.ones(starts.size, bool)
    new[1:] = starts[1:] > reach[:-1]
    first = np.flatnonzero(new)
    last = np.append(first[1:], starts.size) - 1
    return np.stack([starts[first], reach[last] - starts[first]], axis=1)


def _block_rank(snapshots, block_steps: int) -> dict:
    """``{block: rank}``: blocks in the order of the oldest item (by insertion
    sequence) whose first row lies in them — the order a ring store evicts them
    in. Blocks holding no item's first row are not ranked."""
    seqs = np.concatenate([s["seq"].astype(np.int64) for s in snapshots] or [np.zeros(0, np.int64)])
    firsts = np.concatenate([
        s["range_start"][np.concatenate([np.zeros(1, np.int64), np.cumsum(s["num_ranges"].astype(np.int64))[:-1]])]
        if s["num_ranges"].size else s["range_start"][:0] for s in snapshots] or [np.zeros(0, np.int64)]).astype(np.int64)
    by_age = firsts[np.argsort(seqs, kind="stable")] // block_steps
    blocks, first_seen = np.unique(by_age, return_index=True)
    return dict(zip(blocks.tolist(), np.argsort(np.argsort(first_seen)).tolist()))


def _pieces(snapshots, block_steps: int) -> np.ndarray:
    """The referenced rows as ``(block, start, count)`` pieces, one block each,
    blocks ordered by the oldest item that references them (insertion order):
    the order a ring store evicts them in."""
    runs = _runs(snapshots)
    out = []
    for start, count in runs.tolist():
        a, end = start, start + count
        while a < end:
            b = min(end, (a // block_steps + 1) * block_steps)
            out.append((a // block_steps, a, b - a))
            a = b
    pieces = np.array(out, dtype=np.int64).reshape(-1, 3)
    if pieces.size == 0:
        return pieces
    rank = _block_rank(snapshots, block_steps)
    key = np.array([rank.get(b, len(rank) + b) for b in pieces[:, 0].tolist()], dtype=np.int64)
    return pieces[np.lexsort((pieces[:, 1], key))]


def save(path, tables, compression: str | None = None, progress: bool | None = None) -> str:
    """Writes a checkpoint of ``tables`` into a new directory under ``path``;
    returns its path. ``compression``: None or "zstd" (needs the ``zstandard``
    package). ``progress``: a bar on stderr when it takes over a second (default:
    when stderr is a terminal)."""
    from .table import Table
    tables = [tables] if isinstance(tables, Table) else list(tables)
    if not tables or not all(isinstance(t, Table) for t in tables):
        raise InvalidArgument(f"tables must be a non-empty list of reprise.Table, got {tables!r}")
    names = [t.name for t in tables]
    if len(set(names)) != len(names):
        raise InvalidArgument(f"table names must be unique in a checkpoint, got {names}")
    if compression not in (None, "zstd"):
        raise InvalidArgument(f"compression must be None or 'zstd', got {compression!r}")
    if compression == "zstd" and importlib.util.find_spec("zstandard") is None:
        raise InvalidArgument("compression='zstd' needs the zstandard package: pip install 'reprise[zstd]'")
    for t in tables:
        t.store._check_open()
    parent = Path(path)
    parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    _remove_stale_temporaries(parent)
    final = parent / f"ckpt-{time.time_ns():020d}"
    tmp = parent / f".{final.name}.tmp-{os.getpid()}"
    tmp.mkdir(mode=0o700)
    # Every index first (a moment each), then the data with the tables running.
    snaps = [t._native.snapshot() for t in tables]
    stores: list = []
    for t in tables:
        if not any(s is t.store for s in stores):
            stores.append(t.store)
    files: dict = {}
    manifest = {"format": FORMAT, "version": VERSION, "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                "compression": compression, "stores": [], "tables": [], "files": files}
    try:
        views = [_columns_view(st) for st in stores]
        mine = [[k for k, t in enumerate(tables) if t.store is st] for st in stores]
        pieces_of = [_pieces([snaps[k][0] for k in ks], st.block_steps) for ks, st in zip(mine, stores)]
        total = sum(int(p[:, 2].sum()) * sum(rb for _, rb, _ in v) for p, v in zip(pieces_of, views))
        bar = _Progress(total, "checkpoint", progress)
        for i, (st, pieces) in enumerate(zip(stores, pieces_of)):
            out = _Out(tmp / f"store-{i}.rows", None)
            out.write(np.ascontiguousarray(pieces[:, 1:]))
            files[out.path.name] = out.close()
            outs = [_Out(tmp / f"store-{i}.col-{j}", compression) for j in range(len(views[i]))]
            # Block by block, oldest items first: each block's pin goes as soon as its
            # rows are written, so writers that need room get the oldest blocks back
            # early. Adjacent pieces are written together (up to 32 MB).
            row_bytes = sum(rb for _, rb, _ in views[i])
            seg = None  # [first row, end row, blocks]

            def flush(seg):
                a, b, blocks = seg
                for (name, rb, read), o in zip(views[i], outs):
                    o.write(read(a, b))
                bar.update((b - a) * row_bytes)
                done = np.unique(np.asarray(blocks, np.uint32))
                for k in mine[i]:
                    snaps[k][1].release_blocks(done)

            for block, start, count in pieces.tolist():
                if seg is not None and start == seg[1] and (seg[1] - seg[0] + count) * row_bytes <= 32 << 20:
                    seg[1] += count
                    seg[2].append(block)
                    continue
                if seg is not None:
                    flush(seg)
                seg = [start, start + count, [block]]
            if seg is not None:
                flush(seg)
            cols = {}
            for (name, _, _), o in zip(views[i], outs):
                files[o.path.name] = o.close()
                cols[name] = o.path.name
            manifest["stores"].append({
                "signature": [[n, list(f.shape), f.dtype] for n, f in st.signature.items()],
                "capacity": st.capacity, "block_steps": st.block_steps,
                "device": "cpu" if st._device_columns is None else (st.device if st.device != "cpu" else "cuda"),
                "rows": f"store-{i}.rows", "columns": cols,
            })
        bar.close()
        for i, (t, (snap, pins)) in enumerate(zip(tables, snaps)):
            pins.release()
            arrays = {k: v for k, v in snap.items() if isinstance(v, np.ndarray)}
            scalars = {k: v for k, v in snap.items() if not isinstance(v, np.ndarray)}
            buf = io.BytesIO()
            np.savez(buf, **arrays)
            out = _Out(tmp / f"table-{i}.npz", None)
            out.write(buf.getbuffer())
            files[out.path.name] = out.close()
            manifest["tables"].append({"file": out.path.name, "store": next(k for k, s in enumerate(stores) if s is t.store),
                                       "index": scalars})
        out = _Out(tmp / MANIFEST, None)
        out.write(json.dumps(manifest, indent=1, sort_keys=True).encode())
        out.close()
        _fsync_dir(tmp)
        os.rename(tmp, final)
        _fsync_dir(parent)
    except BaseException:
        for _, pins in snaps:
            pins.release()
        _remove(tmp)
        raise
    return str(final)


def _fsync_dir(path: Path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _remove(path: Path):
    if path.exists():
        for f in path.iterdir():
            f.unlink()
        path.rmdir()


def _remove_stale_temporaries(parent: Path):
    """Removes what saves killed midway left behind (their process is gone)."""
    for p in parent.glob(".ckpt-*.tmp-*"):
        try:
            pid = int(p.name.rsplit("-", 1)[1])
            os.kill(pid, 0)
        except ProcessLookupError:
            _remove(p)
        except (ValueError, PermissionError, OSError):
            continue


def checkpoints(path) -> list[str]:
    """The checkpoints under ``path``, newest first (valid or not)."""
    parent = Path(path)
    if not parent.is_dir():
        return []
    return [str(p) for p in sorted(parent.glob("ckpt-*"), reverse=True) if p.is_dir()]


def _read_manifest(ckpt: Path) -> dict:
    mpath = ckpt / MANIFEST
    try:
        manifest = json.loads(mpath.read_bytes())
    except FileNotFoundError:
        raise Corrupt(f"{mpath}: missing: not a complete checkpoint") from None
    except (OSError, ValueError) as e:
        raise Corrupt(f"{mpath}: unreadable ({e})") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise Corrupt(f"{mpath}: not a Reprise checkpoint manifest")
    if manifest.get("version") != VERSION:
        raise Corrupt(f"{mpath}: format version {manifest.get('version')!r}; this Reprise reads version {VERSION}")
    return manifest


def verify(path) -> dict:
    """Checks a checkpoint's manifest and the size and CRC-32 of every file; returns
    the manifest or raises ``Corrupt`` naming the first bad file."""
    ckpt = Path(path)
    manifest = _read_manifest(ckpt)
    try:
        files = dict(manifest["files"])
        for name in files:
            f = _In(ckpt, name, files, None)
            while f.read(_CHUNK):
                pass
            f.finish()
    except (KeyError, TypeError) as e:
        raise Corrupt(f"{ckpt / MANIFEST}: malformed ({e})") from None
    return manifest


def latest(path) -> str | None:
    """The newest checkpoint under ``path`` that verifies, or None."""
    for c in checkpoints(path):
        try:
            verify(c)
            return c
        except Corrupt:
            continue
    return None


class _In:
    """Reads a checkpoint file front to back while checking its size and CRC-32
    against the manifest (``finish``); zstd-decompressed when asked."""

    def __init__(self, ckpt: Path, name: str, files: dict, compression: str | None):
        if "/" in name or name not in files:
            raise Corrupt(f"{ckpt / MANIFEST}: names a file it has no checksum for: {name!r}")
        self.path = ckpt / name
        self.meta = files[name]
        try:
            self._f = open(self.path, "rb")
        except OSError as e:
            raise Corrupt(f"{self.path}: missing or unreadable ({e})") from None
        self.crc, self.size = 0, 0
        self._z = None
        if compression == "zstd":
            import zstandard
            self._z = zstandard.ZstdDecompressor().stream_reader(self, read_across_frames=True)

    def read(self, n: int = -1) -> bytes:  # the raw (stored) bytes, checksummed
        data = self._f.read(n if n is not None and n >= 0 else -1)
        self.crc = zlib.crc32(data, self.crc)
        self.size += len(data)
        return data

    def read_exact(self, n: int) -> bytes:
        """The next ``n`` bytes of content; ``Corrupt`` when the file ends first."""
        src = self._z if self._z is not None else self
        chunks, left = [], n
        try:
            while left > 0:
                c = src.read(min(left, _CHUNK))
                if not c:
                    raise Corrupt(f"{self.path}: ends early (truncated?)")
                chunks.append(c)
                left -= len(c)
        except Corrupt:
            raise
        except Exception as e:  # noqa: BLE001 - a decompressor's error on damaged data
            raise Corrupt(f"{self.path}: cannot decompress ({e})") from None
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)

    def finish(self):
        """Checks that the content is used up and the file matches the manifest."""
        if self._z is not None:
            try:
                extra = self._z.read()  # reads the compressed stream to its end
            except Exception as e:  # noqa: BLE001 - a decompressor's error on damaged data
                raise Corrupt(f"{self.path}: cannot decompress ({e})") from None
            if extra:
                raise Corrupt(f"{self.path}: more data than the manifest's rows")
        rest = self.read()
        self._f.close()
        if self.size != self.meta["bytes"]:
            raise Corrupt(f"{self.path}: {self.size} bytes, the manifest says {self.meta['bytes']} (truncated?)")
        if self.crc != self.meta["crc32"]:
            raise Corrupt(f"{self.path}: checksum mismatch (corrupt)")
        if rest:
            raise Corrupt(f"{self.path}: more data than the manifest's rows")

    def close(self):
        self._f.close()


def _whole(ckpt: Path, name: str, files: dict) -> bytes:
    """A small file's bytes, checked."""
    f = _In(ckpt, name, files, None)
    data = f.read()
    f.finish()
    return data


def _oldest_first(blocks: np.ndarray, block_steps: int, snapshots) -> np.ndarray:
    """``blocks`` in the order the save wrote them (``_block_rank``): the order
    store pressure evicts them in."""
    rank = _block_rank(snapshots, block_steps)
    return np.array(sorted(blocks.tolist(), key=lambda b: (rank.get(b, len(rank)), b)), dtype=np.uint32)


def _write_device(store, name, runs, data, rb):
    import torch
    cols = store._device_columns
    rows = np.concatenate([np.arange(a, a + c, dtype=np.int64) for a, c in runs]) if len(runs) else np.zeros(0, np.int64)
    if rows.size == 0:
        return
    word = cols.views[name].dtype
    words = torch.from_numpy(data.copy()).view(word).view(rows.size, -1).to(cols.device)
    cols.write({name: words}, torch.from_numpy(rows).to(cols.device))


def load(path, progress: bool | None = None, device=None) -> dict:
    """Loads a checkpoint (a directory ``save`` returned, or the newest valid one
    under ``path``) into new stores and tables: ``{name: Table}``. Device stores
    come back on the device they were saved from, or on ``device`` when given.

    Every file is checked (size, CRC-32, consistency) as it is read; on any
    damage the new stores are closed and ``Corrupt`` names the file: nothing is
    loaded."""
    ckpt = Path(path)
    if (ckpt / MANIFEST).exists():
        return _load(ckpt, progress, device)
    for c in checkpoints(ckpt):
        try:
            return _load(Path(c), progress, device)
        except Corrupt:
            continue
    raise Corrupt(f"{ckpt}: no valid checkpoint here")


def _load(ckpt: Path, progress, device_map) -> dict:
    from .store import Store
    from .table import Table
    manifest = _read_manifest(ckpt)
    made = []
    try:
        files = dict(manifest["files"])
        compression = manifest.get("compression")
        # The indexes first (small): every table file checked before any store exists.
        snaps = []
        for t in manifest["tables"]:
            raw = _whole(ckpt, t["file"], files)
            try:
                with np.load(io.BytesIO(raw), allow_pickle=False) as z:
                    snap = {k: z[k] for k in z.files}
            except Exception as e:  # noqa: BLE001 - any damage in a checked file
                raise Corrupt(f"{ckpt / t['file']}: unreadable ({e})") from None
            snap.update(t["index"])
            snaps.append(snap)
        stores = []
        for s_index, s in enumerate(manifest["stores"]):
            sig = {n: Field(tuple(shape), dtype) for n, shape, dtype in s["signature"]}
            device = s.get("device", "cpu")
            store = Store(sig, capacity=s["capacity"], block_steps=s["block_steps"],
                          device=None if device == "cpu" else (device if device_map is None else device_map))
            made.append(store)
            if store.capacity != s["capacity"]:
                raise Corrupt(f"{ckpt / MANIFEST}: capacity {s['capacity']} is not whole blocks of {s['block_steps']}")
            raw = _whole(ckpt, s["rows"], files)
            if len(raw) % 16:
                raise Corrupt(f"{ckpt / s['rows']}: not whole (start, count) pairs")
            runs = np.frombuffer(raw, dtype=np.int64).reshape(-1, 2)
            if (runs < 0).any() or (runs[:, 0] + runs[:, 1] > store.capacity).any():
                raise Corrupt(f"{ckpt / s['rows']}: rows outside the store")
            bs = store.block_steps
            blocks = np.unique(np.concatenate([np.arange(a // bs, (a + c - 1) // bs + 1) for a, c in runs if c > 0]
                                              or [np.zeros(0, np.int64)])).astype(np.uint32)
            mine = [snap for snap, t in zip(snaps, manifest["tables"]) if t["store"] == s_index]
            pins = store._native.reserve_blocks(_oldest_first(blocks, bs, mine))
            if store._device_columns is None:
                layout = [(j, name, rb) for j, (name, _, rb) in enumerate(store._native.column_layout())]
            else:
                layout = [(None, name, rb) for name, rb, _ in _columns_view(store)]
            total = int(runs[:, 1].sum())
            bar = _Progress(total * sum(rb for _, _, rb in layout), "load", progress)
            for j, name, rb in layout:
                src = _In(ckpt, s["columns"][name], files, compression)
                try:
                    for a, c in runs.tolist():
                        data = np.frombuffer(src.read_exact(c * rb), dtype=np.uint8)
                        if j is None:  # a device store
                            _write_device(store, name, np.array([[a, c]]), data, rb)
                        else:
                            store._native.write_reserved(pins, j, int(a), data)
                        bar.update(c * rb)
                    src.finish()
                finally:
                    src.close()
            bar.close()
            stores.append((store, pins))
        out = {}
        for t, snap in zip(manifest["tables"], snaps):
            store, _ = stores[t["store"]]
            for k in ("sampler_order", "remover_order"):
                snap.setdefault(k, None)
            for k in ("sampler", "remover", "rate_limiter", "limiter"):
                snap[k] = tuple(snap[k])
            snap["external_selection"] = False  # restored tables select on the host
            native = _native.Table.restore(store._native, snap)
            out[native.name] = Table._restored(native, store, snap)
        for _, pins in stores:
            pins.release()
        return out
    except BaseException as e:
        for s in made:
            s.close()
        if isinstance(e, (KeyError, TypeError, ValueError)) and not isinstance(e, InvalidArgument):
            raise Corrupt(f"{ckpt}: malformed checkpoint ({type(e).__name__}: {e})") from e
        raise


__all__ = ["save", "load", "verify", "latest", "checkpoints", "FORMAT", "VERSION"]
