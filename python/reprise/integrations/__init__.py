"""Reprise inside other frameworks' replay code. Each integration is its own module, imported
on its own (``reprise.integrations.torchrl``), and needs its framework installed; nothing
here imports one."""
