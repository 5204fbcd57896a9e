"""Atari frames in replay: memory per transition and sampling (issue 36)."""
