"""One Triton launch that gathers the rows of several fields (``reprise.torch.collect``).

``index_select`` reads one column per launch, and a ragged sample needs a second
launch per field to zero the steps past each item's end. This kernel reads every
requested column whose rows are made of the same integer word (see
``columns.word_for``) in one launch, zeroes past each item's end as it goes, and
writes the fields one after another into one output buffer; a sample of fields of
one word width is one launch whatever the number of fields.

The columns are found through a small descriptor per field (address, words per
row, offset of the field in the output, in words per gathered row), built once per
column views and field list and kept on the device. Fields are grouped by word:
int64 words (rows whose size is a multiple of 8 bytes, the common case) in one
launch, then int32, int16 and uint8 words.
"""

from __future__ import annotations

from ._device import torch_module

try:  # Triton is optional: the gpu extra installs it.
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - depends on the environment
    triton = None

# None: on CUDA devices (when Triton is installed); True: on every device (Triton's
# interpreter runs it on the CPU in tests); False: never.
ENABLED: bool | None = None

if triton is not None:

    @triton.jit
    def _gather_kernel(idx_ptr, desc_ptr, out_ptr, nrows, ROWS: tl.constexpr, WORDS: tl.constexpr):
        field = tl.program_id(1)
        src = tl.load(desc_ptr + 3 * field).to(out_ptr.dtype)  # the column's first row
        words = tl.load(desc_ptr + 3 * field + 1)
        out_words = tl.load(desc_ptr + 3 * field + 2) * nrows
        rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
        live = rows < nrows
        row = tl.load(idx_ptr + rows, mask=live, other=-1)
        read = live & (row >= 0)  # -1: past the item's end, zeros
        for w in range(0, words, WORDS):
            col = w + tl.arange(0, WORDS)
            inside = col[None, :] < words
            value = tl.load(src + row[:, None] * words + col[None, :], mask=read[:, None] & inside, other=0)
            tl.store(out_ptr + out_words + rows[:, None] * words + col[None, :], value, mask=live[:, None] & inside)


def available(device) -> bool:
    """Whether gathers on ``device`` (a torch.device) use the kernel."""
    if triton is None or ENABLED is False:
        return False
    return ENABLED is True or device.type == "cuda"


class _Plan:
    """The launches gathering one list of fields from one column views."""

    def __init__(self, columns, names):
        torch = torch_module()
        groups: dict = {}
        for name in names:
            view = columns.views[name]
            groups.setdefault(view.dtype, []).append(name)
        self.groups = []
        for word, fields in groups.items():
            desc, at, widest = [], 0, 1
            for name in fields:
                view = columns.views[name]
                words = view.shape[1]
                desc.append((view.data_ptr(), words, at))
                at, widest = at + words, max(widest, words)
            table = torch.tensor(desc, dtype=torch.int64).to(columns.device)
            # WORDS: a row's words per step (16 bytes or more per thread on wide rows);
            # ROWS: enough rows per program for about 4 K words.
            step = min(triton.next_power_of_2(widest), 512)
            self.groups.append((word, fields, table, at, step, max(1, min(128, 4096 // step))))


def gather(columns, names, idx, nrows: int) -> dict:
    """``{field: [nrows, words] tensor}``: the rows ``idx`` (device int64, -1 for a
    zero row) of each field, one launch per word width."""
    torch = torch_module()
    key = tuple(names)
    plan = columns.gather_plans.get(key)
    if plan is None:
        plan = columns.gather_plans[key] = _Plan(columns, names)
    out = {}
    for word, fields, table, width, step, rows in plan.groups:
        buf = torch.empty(nrows * width, dtype=word, device=columns.device)
        if nrows:
            _gather_kernel[(triton.cdiv(nrows, rows), len(fields))](idx, table, buf, nrows, ROWS=rows, WORDS=step)
        at = 0
        for name in fields:
            words = columns.views[name].shape[1]
            out[name] = buf[at * nrows:(at + words) * nrows].view(nrows, words)
            at += words
    return out
