"""What an element of a ``RepriseStorage`` is: the signature its first write fixes.

- One field per tensor leaf of an element, named by its key: nested keys joined by
  "/", a "/" or "%" inside a key part written %2F or %25, so
  ``key_of(field_name(k)) == k``.
- A field has the leaf's per-element shape (an element's own batch dimensions
  included) and dtype; bfloat16 is kept in an int16 field (its bits) and viewed back on
  read. Later writes must match the first exactly: no casting.
- Elements are TensorDicts, tensorclasses (rebuilt with their class) or plain tensors
  (one field, ``_tensor``). Non-tensor leaves are refused.

``Spec`` checks writes against the signature (``arrays``), rebuilds elements from the
tensors read (``build``) and saves itself as plain data (``state``/``from_state``).
"""

from __future__ import annotations

import importlib

import numpy as np
import torch
from tensordict import TensorDict, TensorDictBase, is_non_tensor, is_tensor_collection, is_tensorclass

from ...errors import InvalidArgument
from ...signature import Field

TENSOR_KEY = ("_tensor",)  # the one field of a storage of plain tensors

# torch dtype -> the Reprise dtype that holds it (bfloat16: its bits, as int16).
CARRIERS = {
    torch.bool: "bool", torch.int8: "int8", torch.int16: "int16", torch.int32: "int32", torch.int64: "int64",
    torch.uint8: "uint8", torch.float16: "float16", torch.float32: "float32", torch.float64: "float64",
    torch.bfloat16: "int16",
}
for _name in ("uint16", "uint32", "uint64"):
    if hasattr(torch, _name):
        CARRIERS[getattr(torch, _name)] = _name


def field_name(key) -> str:
    """The Reprise field name of a TensorDict key: parts joined by "/", each part's
    "%" and "/" written %25 and %2F."""
    key = (key,) if isinstance(key, str) else tuple(key)
    return "/".join(part.replace("%", "%25").replace("/", "%2F") for part in key)


def key_of(name: str) -> tuple:
    """The TensorDict key (a tuple of parts) of a field name: ``field_name``'s inverse."""
    return tuple(part.replace("%2F", "/").replace("%25", "%") for part in name.split("/"))


def show_key(key: tuple) -> str:
    return repr(key[0]) if len(key) == 1 else repr(key)


def dtype_name(dtype) -> str:
    return str(dtype).removeprefix("torch.")


def described(dtype, shape) -> str:
    return f"{dtype_name(dtype)}{list(shape)}"


class Leaf:
    """One tensor leaf of an element: its key, field name, torch dtype and shape."""

    def __init__(self, key: tuple, dtype, shape: tuple):
        self.key, self.dtype, self.shape = key, dtype, tuple(int(d) for d in shape)
        self.name = field_name(key)
        self.carrier = CARRIERS[dtype]

    def to_numpy(self, t) -> np.ndarray:
        t = t.detach().to("cpu")
        if t.dtype == torch.bfloat16:
            t = t.view(torch.int16)
        return t.contiguous().numpy()


class Spec:
    """What the first write fixed: the kind of element, its batch dimensions and leaves."""

    def __init__(self, kind: str, cls, batch: tuple, leaves: list):
        self.kind, self.cls, self.batch, self.leaves = kind, cls, tuple(batch), leaves
        self.by_key = {leaf.key: leaf for leaf in leaves}
        # The sampler's draws copy only this field (the smallest) before positions are read.
        self.cheapest = min(leaves, key=lambda f: Field(f.shape, f.carrier).nbytes).name
        # Where ``build`` puts each leaf: its parent keys and its own, in leaf order.
        self._places = [(leaf.key[:-1], leaf.key[-1]) for leaf in leaves]

    @classmethod
    def infer(cls, data, lead: int) -> "Spec":
        kind, klass, body = unwrap(data)
        if kind == "tensor":
            leaves, batch = [(TENSOR_KEY, body)], ()
        else:
            leaves, batch = tensor_leaves(body), tuple(body.batch_size[lead:])
            if not leaves:
                raise InvalidArgument("RepriseStorage: the first TensorDict written holds no tensor: nothing to store")
        out = []
        for key, t in leaves:
            shape = tuple(t.shape[lead:])
            if t.dtype not in CARRIERS:
                raise InvalidArgument(
                    f"RepriseStorage: key {show_key(key)} is {dtype_name(t.dtype)}, which Reprise cannot store; "
                    f"expected one of {', '.join(sorted({dtype_name(d) for d in CARRIERS}))}")
            if 0 in shape:
                raise InvalidArgument(f"RepriseStorage: key {show_key(key)} has an empty dimension per element "
                                      f"({described(t.dtype, shape)}); every dimension must be >= 1")
            out.append(Leaf(key, t.dtype, shape))
        return cls(kind, klass, batch, out)

    def arrays(self, data, lead: int, n: int) -> dict:
        """``{field: array[n, *shape]}`` of ``data`` (``lead`` = 1 when it holds n
        elements, 0 when one), after checking it against the signature."""
        kind, _, body = unwrap(data)
        if kind != self.kind:
            raise InvalidArgument(f"RepriseStorage holds {self.kind} elements (from its first write), got a {kind}")
        if kind == "tensor":
            got = {TENSOR_KEY: body}
        else:
            want = (n, *self.batch) if lead else self.batch
            if tuple(body.batch_size) != want:
                raise InvalidArgument(f"RepriseStorage: expected a TensorDict of batch size {list(want)} for {n} "
                                      f"element(s) of batch size {list(self.batch)}, got {list(body.batch_size)}")
            got = dict(tensor_leaves(body))
        for key, t in got.items():
            leaf = self.by_key.get(key)
            if leaf is None:
                raise InvalidArgument(f"RepriseStorage: unexpected key {show_key(key)} "
                                      f"({described(t.dtype, t.shape[lead:])} per element); the storage holds the "
                                      f"keys of its first write: {self.keys()}")
        out = {}
        for leaf in self.leaves:
            t = got.get(leaf.key)
            if t is None:
                raise InvalidArgument(f"RepriseStorage: key {show_key(leaf.key)} ({described(leaf.dtype, leaf.shape)}) "
                                      f"is missing; every write needs the keys of the first one: {self.keys()}")
            if t.dtype != leaf.dtype or tuple(t.shape) != ((n, *leaf.shape) if lead else leaf.shape):
                raise InvalidArgument(f"RepriseStorage: key {show_key(leaf.key)} expects "
                                      f"{described(leaf.dtype, leaf.shape)} per element, got "
                                      f"{described(t.dtype, t.shape[lead:])}")
        for leaf in self.leaves:
            a = leaf.to_numpy(got[leaf.key])
            out[leaf.name] = a if lead else a[None]
        return out

    def build(self, tensors: list, lead: tuple, device):
        """The element(s) of ``tensors`` (one ``tensor[*lead, *shape]`` per leaf, in leaf order).

        The TensorDict is assembled without TensorDict's per-key checks
        (``_new_unsafe``, as TorchRL itself does): every tensor was shaped here to
        ``lead`` + its leaf's shape, whose first dimensions are the element's batch."""
        if self.kind == "tensor":
            return tensors[0]
        root: dict = {}
        for (parents, last), t in zip(self._places, tensors):
            node = root
            for part in parents:
                node = node.setdefault(part, {})
            node[last] = t
        td = TensorDict._new_unsafe(root, batch_size=torch.Size((*lead, *self.batch)), device=device)
        return self.cls.from_tensordict(td) if self.kind == "tensorclass" else td

    def keys(self) -> list:
        return [leaf.key[0] if len(leaf.key) == 1 else leaf.key for leaf in self.leaves]

    def state(self) -> dict:
        cls = None if self.cls is None else f"{self.cls.__module__}:{self.cls.__qualname__}"
        return {"kind": self.kind, "class": cls, "batch": list(self.batch),
                "leaves": [[list(f.key), dtype_name(f.dtype), list(f.shape)] for f in self.leaves]}

    @classmethod
    def from_state(cls, state: dict, current: "Spec | None") -> "Spec":
        klass = None
        if state["kind"] == "tensorclass":
            if current is not None and current.state()["class"] == state["class"]:
                klass = current.cls
            else:
                module, _, qualname = state["class"].partition(":")
                try:
                    klass = importlib.import_module(module)
                    for part in qualname.split("."):
                        klass = getattr(klass, part)
                except (ImportError, AttributeError) as e:
                    raise InvalidArgument(f"RepriseStorage: cannot find the tensorclass {state['class']} of the saved "
                                          f"elements ({e}); load into a storage that already holds them") from None
        leaves = [Leaf(tuple(k), getattr(torch, d), tuple(s)) for k, d, s in state["leaves"]]
        return cls(state["kind"], klass, tuple(state["batch"]), leaves)

    def same(self, other: "Spec") -> bool:
        return self.state() == other.state()


def unwrap(data):
    """``(kind, tensorclass or None, TensorDict or tensor)``."""
    if isinstance(data, torch.Tensor) and not is_tensor_collection(data):
        return "tensor", None, data
    if is_tensorclass(data):
        return "tensorclass", type(data), data.to_tensordict()
    if isinstance(data, TensorDictBase):
        return "tensordict", None, data
    raise InvalidArgument(f"RepriseStorage stores TensorDicts, tensorclasses and tensors, got {type(data).__name__}")


def tensor_leaves(td) -> list:
    """``[(key tuple, tensor)]`` of ``td``'s tensor leaves; non-tensor data is refused."""
    out = []
    for key, value in td.items(include_nested=True, leaves_only=False):
        key = (key,) if isinstance(key, str) else tuple(key)
        if isinstance(value, torch.Tensor) and not is_tensor_collection(value):
            out.append((key, value))
        elif is_non_tensor(value):
            raise InvalidArgument(f"RepriseStorage: key {show_key(key)} holds non-tensor data "
                                  f"({type(value).__name__}); only tensors can be stored")
    return out
