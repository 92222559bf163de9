"""A torchrun rank's entry point: `python -m stepbench.measure.rank JOB` (execute/executor.py).

It runs stepbench.measure.distributed.main from the imported module rather than from a
`__main__` copy of it (what `python -m stepbench.measure.distributed` would run), so that the
process has one set of those functions: whatever wraps them as the module is imported (the
tests' fault hooks, tests/hooks) wraps the ones that run.
"""

import sys

from stepbench.measure import distributed

distributed.main(sys.argv[1:])     # never returns: it ends the process (process.exit_now)
