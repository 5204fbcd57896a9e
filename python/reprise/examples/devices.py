"""``--device``: checked before a demo starts anything, so that a device this machine does
not have is one clear refusal (exit 2) instead of a process that fails again and again."""

from __future__ import annotations


def device_problem(device: str | None) -> str | None:
    """Why ``--device device`` cannot be used here, or None when it can (None: the demo
    picks cuda when available, else cpu). Imports torch only when a device is given. A CUDA
    device is checked without creating a CUDA context."""
    if device is None:
        return None
    import torch
    try:
        dev = torch.device(device)
    except (RuntimeError, ValueError) as e:
        return f"--device {device}: not a device torch knows ({e}); use cpu, cuda or cuda:N"
    if dev.type == "cuda":
        if torch.version.cuda is None and getattr(torch.version, "hip", None) is None:
            return (f"--device {device}: this torch ({torch.__version__}) was built without CUDA; "
                    "install a CUDA build of torch, or use --device cpu")
        if not torch.cuda.is_available():
            return (f"--device {device}: CUDA is not available here (torch {torch.__version__} found no CUDA "
                    "device); use --device cpu, or leave --device out to use CUDA only where it is available")
        count = torch.cuda.device_count()
        if dev.index is not None and dev.index >= count:
            return f"--device {device}: this machine has {count} CUDA device(s) (cuda:0 to cuda:{count - 1})"
        return None
    if dev.type == "cpu":
        return None
    try:
        torch.empty(1, device=dev)
    except Exception as e:  # noqa: BLE001 - any failure means the device is unusable; the message says why
        return f"--device {device}: torch cannot allocate there ({type(e).__name__}: {e}); use cpu or cuda"
    return None


__all__ = ["device_problem"]
