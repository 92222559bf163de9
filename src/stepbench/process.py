"""How long a process of stepbench's may live, for both sides of the layers: a torchrun rank
(measure/distributed.py) and a command that a remote host's hostside runs (execute/hostside.py)
must not outlive the process that started them. A base module, so that measure/ never imports
execute/ for it.
"""

from __future__ import annotations

import ctypes
import signal

PR_SET_PDEATHSIG = 1


def die_with_parent(sig: int = signal.SIGKILL) -> None:
    """Ask Linux to send `sig` (SIGKILL) to this process when its parent dies, even by SIGKILL.
    Safe as a Popen preexec_fn (it runs in the child before exec); a no-op where prctl is
    missing."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
    except (OSError, AttributeError):
        pass
