"""Item attributes: checking what a caller gives and laying it out as the core's
records (each item's attributes side by side, in the table's order, native
little-endian bytes: a numpy structured array with no padding)."""

from __future__ import annotations

import numpy as np

from .errors import InvalidArgument, NotFound


def check_schema(table: str, attributes) -> list[tuple[str, str]]:
    """``{name: dtype}`` as the core takes it: ``[(name, numpy dtype name)]``."""
    if attributes is None:
        return []
    if not isinstance(attributes, dict):
        raise InvalidArgument(f"table '{table}': attributes must be a dict {{name: dtype}}, got {attributes!r}")
    out = []
    for name, dtype in attributes.items():
        if not isinstance(name, str) or not name:
            raise InvalidArgument(f"table '{table}': attribute names must be non-empty strings, got {name!r}")
        try:
            dt = np.dtype(dtype)
        except TypeError:
            raise InvalidArgument(f"table '{table}': attribute '{name}' has dtype {dtype!r}; expected a numeric "
                                  f"numpy dtype such as 'int64' or 'float32'") from None
        out.append((name, dt.name))
    return out


def _layout(schema) -> np.dtype:
    return np.dtype([(name, np.dtype(dtype).newbyteorder("<")) for name, dtype in schema])


def record_size(schema) -> int:
    """Bytes of one item's record (0 without attributes)."""
    return _layout(schema).itemsize if schema else 0


def records(schema, table: str, attributes, n: int) -> bytes:
    """The records of ``n`` items from ``{name: value}``: a scalar (every item) or
    an array of ``n``. Every attribute of the table must be given and nothing else;
    values must cast to the attribute's dtype without changing kind (an int may go
    into a float attribute, a float never into an int one)."""
    if not schema:
        if attributes:
            raise InvalidArgument(f"table '{table}' has no attributes; got {sorted(attributes)}")
        return b""
    names = [name for name, _ in schema]
    if attributes is None:
        raise InvalidArgument(f"table '{table}': every item needs its attributes {names}; none were given")
    if not isinstance(attributes, dict):
        raise InvalidArgument(f"table '{table}': attributes must be a dict {{name: value}}, got {type(attributes).__name__}")
    unknown = [k for k in attributes if k not in names]
    if unknown:
        raise NotFound(f"table '{table}' has no attribute {unknown[0]!r}; its attributes are {names}")
    missing = [k for k in names if k not in attributes]
    if missing:
        raise InvalidArgument(f"table '{table}': attribute {missing[0]!r} is missing; every item needs {names}")
    out = np.empty(n, dtype=_layout(schema))
    for name, dtype in schema:
        out[name] = column(table, name, dtype, attributes[name], n)
    return out.tobytes()


def column(table: str, name: str, dtype: str, value, n: int) -> np.ndarray:
    """``value`` as ``n`` values of attribute ``name`` (checked, not yet copied)."""
    if hasattr(value, "detach") and hasattr(value, "cpu"):  # a torch tensor
        value = value.detach().cpu().numpy()
    a = np.asarray(value)
    target = np.dtype(dtype)
    if a.dtype.kind not in "biuf":
        raise InvalidArgument(f"table '{table}': attribute '{name}' must be numeric ({dtype}), got {a.dtype}")
    if not np.can_cast(a.dtype, target, casting="same_kind"):
        raise InvalidArgument(f"table '{table}': attribute '{name}' is {dtype}; got {a.dtype} values, which "
                              f"would lose their kind")
    if a.ndim == 1 and a.shape[0] != n or a.ndim > 1:
        raise InvalidArgument(f"table '{table}': attribute '{name}' has shape {list(a.shape)}; expected one value "
                              f"for every item, [{n}] (or a scalar)")
    if a.dtype.kind in "iu" and target.kind in "iu" and a.size:
        info = np.iinfo(target)
        lo, hi = a.min(), a.max()
        if lo < info.min or hi > info.max:
            raise InvalidArgument(f"table '{table}': attribute '{name}' ({dtype}) cannot hold {lo if lo < info.min else hi}")
    return a


def arrays(schema, raw: bytes, n: int) -> dict:
    """``{name: array[n]}`` of ``n`` items' records ``raw`` (``{}`` without attributes)."""
    if not schema or not raw:
        return {}
    rec = np.frombuffer(raw, dtype=_layout(schema), count=n)
    return {name: np.ascontiguousarray(rec[name]).astype(np.dtype(dtype), copy=False) for name, dtype in schema}


def check_fixed(what: str, attributes: dict, versioned: bool, grouped: bool) -> None:
    """Refuses ``update_attributes`` of what an item fixes when it is created, before
    anything changes: its version under ``max_staleness`` (``versioned``), its group under
    ``group_size`` (``grouped``). ``what`` names the table (``table 'x'``)."""
    if "version" in attributes and versioned:
        raise InvalidArgument(f"{what} has max_staleness: an item's version is fixed when it is created and cannot "
                              f"be updated")
    if "group" in attributes and grouped:
        raise InvalidArgument(f"{what} has group_size: an item's group is fixed when it is created and cannot be "
                              f"updated")


def values(schema, table: str, name: str, value, n: int) -> bytes:
    """``n`` values of attribute ``name`` as its dtype's bytes (``update_attributes``)."""
    dtypes = dict(schema)
    if name not in dtypes:
        raise NotFound(f"table '{table}' has no attribute {name!r}; its attributes are {list(dtypes)}")
    a = column(table, name, dtypes[name], value, n)
    return np.broadcast_to(a, (n,)).astype(np.dtype(dtypes[name]).newbyteorder("<")).tobytes()
