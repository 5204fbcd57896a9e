"""Whether Triton's CPU interpreter (TRITON_INTERPRET=1) can run the GPU path's kernels here.

Some Triton releases' interpreters cannot run a loop bounded by a kernel argument under
newer numpy (the interpreter turns the argument into a one-element array and calls int()
on it, which numpy >= 2.5 refuses: "only 0-dimensional arrays can be converted to Python
scalars"; seen with triton 3.6.0 + numpy 2.5.2). That is the interpreter's limit, not the
kernels': the interpreted checks skip naming it, and the compiled checks (with CUDA) still run.
"""

import os


def interpreter_problem() -> str | None:
    """None when the interpreter runs a loop bounded by a kernel argument, else why not.
    Call only in a process started with TRITON_INTERPRET=1."""
    assert os.environ.get("TRITON_INTERPRET") == "1"
    import numpy as np
    import torch
    import triton
    import triton.language as tl

    @triton.jit
    def _count(out_ptr, n, BLOCK: tl.constexpr):
        total = tl.zeros((BLOCK,), dtype=tl.int64)
        for c in range(0, n, BLOCK):
            total += tl.where(c + tl.arange(0, BLOCK) < n, 1, 0)
        tl.store(out_ptr + tl.arange(0, BLOCK), total)

    out = torch.zeros(4, dtype=torch.int64)
    try:
        _count[(1,)](out, 10, BLOCK=4)
    except Exception as e:  # noqa: BLE001 - any failure of the probe is the answer
        return (f"Triton {triton.__version__}'s interpreter cannot run a loop bounded by a kernel "
                f"argument with numpy {np.__version__} ({type(e).__name__}: {e})")
    if int(out.sum()) != 10:
        return f"Triton {triton.__version__}'s interpreter counted {int(out.sum())} of 10 in a probe loop"
    return None
