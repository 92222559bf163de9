"""The local backend: each setup's process on this host, forked by a process server (server.py,
serving.py) or started fresh (process.py), on one GPU or a pool of them (pool.py).

How a setup's process starts (`--start`) is decided here, for every backend that runs processes
(a host's, a Ray or Slurm job's): `uses_server`.
"""

from __future__ import annotations

SERVER = "server"       # forked by a process server that imported torch and transformers once
FRESH = "fresh"         # a new Python process that imports them itself
START_METHODS = (SERVER, FRESH)


def uses_server(start) -> bool:
    """Whether `--start` asks for a process server to fork the setups' processes."""
    return start == SERVER
