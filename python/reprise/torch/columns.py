"""Column views for the GPU path: a store's columns as device tensors.

Every column is viewed as ``[capacity, words]`` of the widest integer word that
divides its row (8, 4, 2 or 1 bytes), so one gather kernel serves every dtype and
copies whole rows with wide loads; results are re-viewed as the field's dtype.

* ``HostColumns``: shared-memory columns registered with CUDA (page-locked and
  mapped into the device's address space, once per process and region), so that
  kernels read rows straight from host memory over PCIe: no staging copy.
* ``DeviceColumns``: columns allocated in GPU memory (``Store(device="cuda")``).
"""

from __future__ import annotations

import ctypes
import threading

import numpy as np

from .._convert import to_field_array
from ..errors import InvalidArgument, RepriseError
from ._device import Mapped, torch_module

_WORDS = ((8, "int64"), (4, "int32"), (2, "int16"), (1, "uint8"))
# cudaHostRegisterPortable | cudaHostRegisterMapped
_REGISTER_FLAGS = 0x01 | 0x02
_ALREADY_REGISTERED = 712  # cudaErrorHostMemoryAlreadyRegistered


def word_for(row_bytes: int, offset: int = 0):
    """The widest integer dtype whose size divides both ``row_bytes`` and ``offset``."""
    torch = torch_module()
    for size, name in _WORDS:
        if row_bytes % size == 0 and offset % size == 0:
            return getattr(torch, name), row_bytes // size
    raise AssertionError("unreachable: 1 divides everything")


def torch_dtype(name: str):
    torch = torch_module()
    return {"bool": torch.bool}.get(name) or getattr(torch, name)


_REGISTERED: dict = {}  # (address, device index) -> [registered by us, views using it]
_REGISTERED_LOCK = threading.Lock()


def _clear_last_error():
    """A failed runtime call leaves its error for the next launch check to find;
    reset it through the process's own libcudart (best effort)."""
    try:
        with open("/proc/self/maps") as f:
            paths = {line.split()[-1] for line in f if "libcudart.so" in line}
        for path in paths:
            ctypes.CDLL(path).cudaGetLastError()
    except OSError:
        pass


class ColumnViews:
    """``views[field]``: a ``[capacity, words]`` tensor; ``field_shapes[field]``:
    (shape, dtype name)."""

    def __init__(self, signature: dict, device):
        self.device = device
        self.fields = list(signature)
        self.field_shapes = {name: (tuple(f.shape), f.dtype) for name, f in signature.items()}
        self.views: dict = {}
        self.gather_plans: dict = {}  # field names -> gather_kernels' launches

    def as_field(self, name: str, words, leading: tuple):
        """Re-views a gathered ``[rows, words]`` tensor as ``[*leading, *shape]`` of the field's dtype."""
        shape, dtype = self.field_shapes[name]
        return words.view(torch_dtype(dtype)).view(*leading, *shape)

    def wait_for_writes(self, stream=None):
        """Makes ``stream`` (None: the current one) wait until the rows written so
        far can be read. Host columns are written by the CPU before an item is
        published: nothing to wait for."""


class HostColumns(ColumnViews):
    """A store's shared-memory columns, mapped for the device."""

    def __init__(self, memory: tuple[int, int], layout, signature: dict, capacity: int, device, owner):
        super().__init__(signature, device)
        torch = torch_module()
        address, nbytes = memory
        self._address, self._registered = address, False
        if device.type == "cuda":
            self._key = (address, device.index)
            with _REGISTERED_LOCK:
                users = _REGISTERED.get(self._key)
                if users is None:
                    with torch.cuda.device(device):
                        err = torch.cuda.cudart().cudaHostRegister(address, nbytes, _REGISTER_FLAGS)
                    code = int(getattr(err, "value", err))
                    if code == _ALREADY_REGISTERED:  # by someone else in this process: usable as is
                        _clear_last_error()
                    elif code != 0:
                        _clear_last_error()
                        raise RepriseError(
                            f"cudaHostRegister of the store's {nbytes} bytes of shared memory failed with CUDA error "
                            f"{code}; the GPU cannot read it in place (is the locked-memory limit, ulimit -l, too low?)"
                        )
                    users = _REGISTERED[self._key] = [code == 0, 0]
                users[1] += 1
            self._registered = True
            base = torch.as_tensor(Mapped(address, nbytes, owner), device=device)
        else:
            buf = (ctypes.c_uint8 * nbytes).from_address(address)
            base = torch.from_numpy(np.ctypeslib.as_array(buf))
            base._reprise_owner = owner  # keep the mapping alive with the view
        for name, offset, row_bytes in layout:
            word, words = word_for(row_bytes, offset)
            col = base[offset:offset + capacity * row_bytes]
            self.views[name] = col.view(word).view(capacity, words)

    def __del__(self):
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter teardown
            pass

    def close(self):
        """Unregisters the memory (before it is unmapped). The views must not be used after."""
        if self._registered:
            self._registered = False
            torch = torch_module()
            with _REGISTERED_LOCK:
                users = _REGISTERED[self._key]
                users[1] -= 1
                if users[1] == 0:
                    del _REGISTERED[self._key]
                    if users[0]:
                        with torch.cuda.device(self.device):
                            torch.cuda.cudart().cudaHostUnregister(self._address)
        self.views.clear()
        self.gather_plans.clear()


def close_all(views: dict):
    """Closes ``{key: HostColumns}`` (a store's or a client's registrations) once
    the gathers in flight have read their rows, and empties it."""
    if views:
        from .collect import wait_released
        wait_released()
        for v in views.values():
            v.close()
        views.clear()


class DeviceColumns(ColumnViews):
    """Columns in GPU memory for ``capacity`` steps."""

    def __init__(self, signature: dict, capacity: int, device):
        super().__init__(signature, device)
        torch = torch_module()
        for name, f in signature.items():
            row_bytes = int(np.prod(f.shape, dtype=np.int64)) * np.dtype(f.dtype).itemsize
            word, words = word_for(row_bytes)
            try:
                self.views[name] = torch.zeros((capacity, words), dtype=word, device=device)
            except RuntimeError as e:  # out of device memory
                raise InvalidArgument(
                    f"device store: field '{name}' needs {capacity * row_bytes} bytes on {device}: {e}"
                ) from e
        self._writes_lock = threading.Lock()
        self._writes: dict = {}  # stream -> event after the latest write on it

    def as_words(self, name: str, value, lead: tuple, what: str):
        """Checks ``value`` (``[*lead, *shape]`` of the field's dtype: a tensor on any
        device, or what the host writer accepts) and returns it as ``[rows, words]``
        on the device, rows = prod(lead)."""
        torch = torch_module()
        shape, dtype = self.field_shapes[name]
        want = torch_dtype(dtype)
        if not isinstance(value, torch.Tensor):
            if isinstance(value, np.ndarray) and value.dtype != np.dtype(dtype):
                raise InvalidArgument(f"{what}field '{name}' expects {dtype}, got an array of {value.dtype}")
            arr = to_field_array(value, dtype, name, f"{dtype}{list(shape)}")
            value = torch.from_numpy(arr if arr.flags.c_contiguous else arr.copy())  # keeps 0-d arrays 0-d
        elif value.dtype != want:
            raise InvalidArgument(f"{what}field '{name}' expects {dtype}, got tensor of {value.dtype}")
        expected = (*lead, *shape)
        if tuple(value.shape) != expected:
            raise InvalidArgument(f"{what}field '{name}' expects shape {list(expected)}, got {list(value.shape)}")
        rows = int(np.prod(lead, dtype=np.int64))
        value = value.to(self.device, non_blocking=True).contiguous()
        word = self.views[name].dtype
        return value.reshape(rows, -1).view(torch.uint8).view(word).view(rows, -1)

    def write(self, fields_words: dict, rows):
        """Writes ``{field: [k, words]}`` at row numbers ``rows`` (a device int64 [k]),
        on the current stream, and records the write for readers on other streams."""
        from ._device import current_stream, new_event
        for name, words in fields_words.items():
            self.views[name].index_copy_(0, rows, words)
        stream = current_stream(self.device)
        event = new_event(self.device)
        event.record(stream)
        with self._writes_lock:
            self._writes[stream] = event

    def wait_for_writes(self, stream=None):
        """Makes ``stream`` (None: the current one) wait for every write recorded so
        far (items published after their rows were written, so a reader that found
        an item sees its rows)."""
        from ._device import current_stream
        with self._writes_lock:
            events = list(self._writes.values())
        if events and stream is None:
            stream = current_stream(self.device)
        for e in events:
            stream.wait_event(e)
