"""Remote comparison: Reprise's gRPC service against Reverb's server over loopback, with
a plain-socket limit (``compare.py``; workloads in ``workloads.py``, Reprise's side in
``reprise_remote.py``, the limit in ``loopback_socket.py``)."""
