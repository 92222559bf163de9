"""The wrappers that tests/hooks/sitecustomize.py installs, and the variables that arm them.

Imported by the tests too (for the variables' names): importing it installs nothing.
"""

import functools
import os
import sys
import time

DIVERGE_ENV = "STEPBENCH_TEST_DIVERGE"
FAULT_ENV = "STEPBENCH_TEST_FAULT"
# "NAME:KIND:PHASE[,...]": the setup named NAME (Setup.name) fails as it enters PHASE (a progress
# phase of measure/step.py: building, first_step, warmup, timed): KIND raise, crash (exit 3),
# segv (SIGSEGV), hang, or kill-parent (SIGKILL to the process that started it, then go on).
SETUP_FAULT_ENV = "STEPBENCH_TEST_SETUP_FAULT"
# Set: the process server starts a thread after its imports (it must then refuse to fork).
SERVER_THREAD_ENV = "STEPBENCH_TEST_SERVER_THREAD"
# Seconds (the test Ray cluster's, tests/raynet.py): Ray's dashboard polls at this interval where
# it polls once a second while it streams a job's log (RAY_POLLS).
RAY_POLL_ENV = "STEPBENCH_TEST_RAY_POLL_S"
# Ray's dashboard's polling intervals (Ray 2.60): the job manager's, between its reads of a job's
# log file to stream it (on the node of the job's driver); the job head's, waiting for the job's
# supervisor to say that node (it sleeps once more after it did). The log file's reader
# (job/utils.py's file_tail_iterator) sleeps a second of its own at the file's end: that
# module's asyncio is one whose sleep lasts at most RAY_POLL_ENV seconds (quick_sleeps).
# The job manager also looks at each running job's supervisor once a loop period
# (JOB_MONITOR_LOOP_PERIOD_S): how soon a job's end is seen, and what stepbench's deletion of an
# ended job waits SETTLE_S on (settle_sooner).
RAY_POLLS = ("LOG_TAIL_SLEEP_S", "WAIT_FOR_SUPERVISOR_ACTOR_INTERVAL_S", "JOB_MONITOR_LOOP_PERIOD_S")
# SETTLE_S is 3 of the job manager's loop periods at Ray's 1 s (execute/ray/jobs.py); at the
# test cluster's 0.1 s, 10 periods: a loop on a loaded machine takes longer than its sleep.
SETTLE_POLLS = 10


def spoil_weights(apply_options):
    """apply_options, then the output embedding weights x 64 for the setup DIVERGE_ENV names."""

    @functools.wraps(apply_options)
    def apply_then_spoil(model, setup, **kwargs):
        model = apply_options(model, setup, **kwargs)
        if os.environ.get(DIVERGE_ENV) == setup.name:
            import torch    # already imported by measure/options, the module this wraps

            with torch.no_grad():
                model.get_output_embeddings().weight.mul_(64.0)
        return model

    return apply_then_spoil


def fail_on_entry(enter_phase):
    """enter_phase, then the fault FAULT_ENV asks for when this rank enters that phase; the
    phase is written first, so the parent reads where the rank failed."""

    @functools.wraps(enter_phase)
    def enter_then_fail(state, phase, *args):
        enter_phase(state, phase, *args)
        inject_fault(state.data["rank"], phase)

    return enter_then_fail


def inject_fault(rank: int, phase: str) -> None:
    target, kind, at = (os.environ.get(FAULT_ENV, "").split(":") + ["", "", ""])[:3]
    if target != str(rank) or at != phase:
        return
    if kind == "raise":
        raise RuntimeError(f"fault injected by the tests on rank {rank} in phase {phase}")
    if kind == "crash":
        os._exit(3)
    if kind == "hang":
        while True:
            time.sleep(60)


def fail_in_setup(measure):
    """step.measure, with its progress callback failing where SETUP_FAULT_ENV says."""

    @functools.wraps(measure)
    def measure_with_faults(setup, result, progress, *args, **kwargs):
        faults = [spec.split(":") for spec in os.environ.get(SETUP_FAULT_ENV, "").split(",")
                  if spec.count(":") == 2]
        mine = {phase: kind for name, kind, phase in faults if name == setup.name}

        def progress_then_fail(phase, *pargs, **info):
            progress(phase, *pargs, **info)
            kind = mine.get(phase)
            if kind == "raise":
                raise RuntimeError(f"fault injected by the tests in phase {phase}")
            if kind == "crash":
                os._exit(3)
            if kind == "segv":
                import signal

                os.kill(os.getpid(), signal.SIGSEGV)
            if kind == "hang":
                while True:
                    time.sleep(60)
            if kind == "kill-parent":
                import signal

                os.kill(os.getppid(), signal.SIGKILL)

        return measure(setup, result, progress_then_fail, *args, **kwargs)

    return measure_with_faults


def thread_after_preload(preload):
    """The server's preload, then a thread when SERVER_THREAD_ENV is set."""

    @functools.wraps(preload)
    def preload_then_thread(spec, *args, **kwargs):
        seconds = preload(spec, *args, **kwargs)
        if os.environ.get(SERVER_THREAD_ENV):
            import threading

            threading.Thread(target=time.sleep, args=(3600,), daemon=True).start()
        return seconds

    return preload_then_thread


def poll_faster(cls):
    """A class of Ray's dashboard with its RAY_POLLS at RAY_POLL_ENV seconds, where set (read as
    the module is imported: the dashboard imports it once, at its start). Where Ray has renamed
    them, nothing changes: its log streams then only come later."""
    seconds = os.environ.get(RAY_POLL_ENV)
    if seconds:
        for name in RAY_POLLS:
            if hasattr(cls, name):
                setattr(cls, name, float(seconds))
    return cls


def quick_sleeps(asyncio_module):
    """A module's `asyncio` whose sleep lasts at most RAY_POLL_ENV seconds, where set."""
    seconds = os.environ.get(RAY_POLL_ENV)
    if not seconds:
        return asyncio_module

    class QuickSleeps:
        def __getattr__(self, name):
            return getattr(asyncio_module, name)

        @staticmethod
        async def sleep(delay, result=None):
            return await asyncio_module.sleep(min(delay, float(seconds)), result)

    return QuickSleeps()


def settle_sooner(settle_s):
    """stepbench's SETTLE_S (a deleted job watched for that long, for a FAILED written by Ray's
    job manager late) as the same number of the job manager's loop periods at RAY_POLL_ENV
    seconds, where set: the test cluster's job manager (poll_faster) looks that much sooner."""
    seconds = os.environ.get(RAY_POLL_ENV)
    return min(settle_s, SETTLE_POLLS * float(seconds)) if seconds else settle_s


# module -> (name of a function, class or module it uses; wrapper factory)
PATCHES = {
    "stepbench.measure.options": ("apply_options", spoil_weights),
    "stepbench.measure.distributed": ("enter_phase", fail_on_entry),
    "stepbench.measure.step": ("measure", fail_in_setup),
    "stepbench.execute.local.serving": ("preload", thread_after_preload),
    "stepbench.execute.ray.jobs": ("SETTLE_S", settle_sooner),
    "ray.dashboard.modules.job.job_manager": ("JobManager", poll_faster),
    "ray.dashboard.modules.job.job_head": ("JobHead", poll_faster),
    "ray.dashboard.modules.job.utils": ("asyncio", quick_sleeps),
}


class PatchAfterImport:
    """A meta path finder that lets the other finders find a module of PATCHES, and wraps the
    function once the module's code has run (before anything can bind it by name)."""

    def find_spec(self, name, path, target=None):
        if name not in PATCHES:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                break
        else:
            return None
        function, wrapper = PATCHES[name]
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            setattr(module, function, wrapper(getattr(module, function)))

        spec.loader.exec_module = exec_module
        return spec


def install() -> None:
    if not any(isinstance(f, PatchAfterImport) for f in sys.meta_path):
        sys.meta_path.insert(0, PatchAfterImport())
