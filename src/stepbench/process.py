"""How long a process of stepbench's may live, for both sides of the layers: a torchrun rank
(measure/distributed.py) and a command that a remote host's hostside runs (execute/hosts/hostside.py)
must not outlive the process that started them; and how a process that imported torch ends
(`exit_now`). A base module, so that measure/ never imports execute/ for it.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

PR_SET_PDEATHSIG = 1


def die_with_parent(sig: int = signal.SIGKILL) -> None:
    """Ask Linux to send `sig` (SIGKILL) to this process when its parent dies, even by SIGKILL.
    Safe as a Popen preexec_fn (it runs in the child before exec); a no-op where prctl is
    missing."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
    except (OSError, AttributeError):
        pass


def exit_now(code: int) -> None:
    """End this process now, its output flushed, without the interpreter's teardown: with torch
    and transformers imported, module clean-up (and inductor's compile-worker pool shutdown, CUDA
    context destructors) takes a second or more and does nothing its parent needs. For a process
    whose work is done and whose children are already ended: a setup's process once its result is
    sent, a process server once it ended what it forked."""
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os._exit(code)
