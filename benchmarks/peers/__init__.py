"""The peers' sides of every comparison, one module per (peer, suite): ``cpprb_core``,
``torchrl_core``, ``reverb_core``, ``cpprb_serving``, ``reverb_serving``, ``redis_serving``,
``reverb_remote``, ``reverb_checkpoint``, ``torchrl_gpu``; ``reverb_common`` is the Reverb
server they share. Each runs in its peer's venv (``setup_peers.sh``), as a module from the
repository root."""
