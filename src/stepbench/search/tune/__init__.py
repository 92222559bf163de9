"""`stepbench tune`: the fastest setup of one model on this machine, found within a time budget.

A search, not a matrix: it proposes setups, has each measured in its own process by the same
Runner and executor as `run` (every measurement is a record in the results file, tagged
`search`, so an interrupted tune resumes and `stepbench report` shows it), reads the records and
decides what to measure next. Every measurement runs the final steps (`--warmup`, `--steps`):
the best one measured is already a final, and the loss guard sees every step. The stages
(docs/tune.md says the same for users; results.STAGES names them in the records and the JSON):

ladder    eager mode with the plainest attention (the loss guard's reference) at the start
          batch, doubled until it runs out of memory or a doubling buys less than LADDER_GAIN
          more tokens/s: the memory a sequence takes, the batch where throughput saturates
          (the largest rung that ran), and the guard's reference at every batch used later;
compiled  torch.compile with each attention kernel at the saturating batch and the one below;
explore   one change at a time on any setup measured (an option, another kernel, a doubled
          batch, compilation, checkpointing where a batch ran out of memory);
reference the guard's reference at a leading setup's batch that the ladder did not reach;
final     more processes of the two best, interleaved, only as many as the test between them
          needs (`final`).

The parts: space.py (what it may vary), strategy.py (the stages and the choice by value per
second), budget.py (the time it has, what a candidate is worth), measured.py (what it has
measured, read as the search asks), finals.py (the finals and the verdict), results.py (the
TuneResult: the one part the report imports).

Objective "fit": the fastest setup at the given batch whose step fits under --memory-limit-gb
(the cap stands in for a smaller card); the batch is not grown and checkpointing is an option.
"""

from stepbench.search.tune.results import STAGES, Tried, TuneResult, is_earlier, label, stage_of
from stepbench.search.tune.space import Space, default_space, space_for, start
from stepbench.search.tune.strategy import Tuner

__all__ = ["STAGES", "Space", "Tried", "TuneResult", "Tuner", "default_space", "is_earlier",
           "label", "space_for", "stage_of", "start"]
