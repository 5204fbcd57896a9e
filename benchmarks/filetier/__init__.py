"""File stores against TorchRL's LazyMemmapStorage on data larger than memory (issue 36)."""
