"""The tests' fault hooks, loaded by every Python process that has tests/hooks on its PYTHONPATH.

Python's `site` imports `sitecustomize` at interpreter start, so a test that puts this folder
first on PYTHONPATH (conftest.with_hooks) reaches every process the run starts beneath it: a
setup's worker, torchrun and its ranks, all of which inherit the environment. What it installs
(stepbench_test_hooks.install) is a `sys.meta_path` finder and nothing else: no torch at start,
and a process that never imports the patched modules never notices it. When
stepbench.measure.options or stepbench.measure.distributed is executed, the finder wraps one of
its functions with a version that reads its variable at call time:

- DIVERGE_ENV = a setup's name: `options.apply_options` multiplies that setup's output
  embedding weights by 64 after applying its options, so its loss departs (the loss guard's
  tests);
- FAULT_ENV = "RANK:KIND:PHASE": `distributed.enter_phase` makes rank RANK fail as it enters
  PHASE: KIND "raise" raises RuntimeError("fault injected by the tests on rank RANK in phase
  PHASE"), "crash" exits with code 3 without a word, "hang" sleeps forever;
- SETUP_FAULT_ENV = "NAME:KIND:PHASE[,...]": `step.measure`'s progress makes the setup NAME fail
  as it enters PHASE (raise, crash, segv, hang, or kill-parent: SIGKILL to its parent, the
  process server, then go on);
- SERVER_THREAD_ENV set: the process server's `preload` starts a thread (it must then refuse
  to fork).
- RAY_POLL_ENV = seconds: Ray's dashboard (the test Ray cluster's processes have this folder on
  their PYTHONPATH, tests/raynet.py) polls a job's log file and its supervisor at that interval
  instead of once a second, so that a job's lines and its end reach stepbench sooner (three class
  attributes, and the log reader's module's asyncio.sleep, set as their modules are imported);
  in a stepbench client (tests/test_ray.py's), a deleted job is watched for 10 such intervals,
  not SETTLE_S's 3 s.

Because the variables are read at call time, a process forked from a long-lived one after these
modules were imported there (a process server's child) is reached too, with the variables of its
own environment. Product code calls the wrapped functions through their module's namespace at
call time (step.py: `options.apply_options`; distributed.main: `enter_phase`, and it runs as the
imported module, not as `__main__`), which is what lets a wrapper installed at import stand in.

This file shadows any other sitecustomize on the path (the test environment has none).
"""

import stepbench_test_hooks

stepbench_test_hooks.install()
