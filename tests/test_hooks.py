"""The tests' fault hooks (tests/hooks) reach a process forked from a long-lived one after
stepbench's modules were imported there, with the variables of the child's own environment: the
way a process server's child is started (import once, fork per setup, then the setup's
environment)."""

import json
import os
import subprocess
import sys

import pytest

from conftest import DIVERGE_ENV, FAULT_ENV, with_hooks

# The long-lived process: imports (the hook wraps as they happen), then forks; only the child
# sets the variable, and reports back on a pipe.
SERVER = """
import json, os, sys
assert "torch" not in sys.modules, "the hooks imported torch at interpreter start"
{imports}
read, write = os.pipe()
pid = os.fork()
if pid == 0:
    os.close(read)
    os.environ[{name!r}] = {value!r}
{child}
    os.write(write, json.dumps(report).encode())
    os._exit(0)
os.close(write)
with os.fdopen(read) as pipe:
    print(pipe.read())
os.waitpid(pid, 0)
"""


def serve(imports: str, name: str, value: str, child: str) -> dict:
    code = SERVER.format(imports=imports, name=name, value=value, child=child)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300, env=with_hooks(os.environ))
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


@pytest.mark.slow
def test_a_forked_child_spoils_the_weights_its_own_environment_names():
    imports = """
import torch
from stepbench.measure import options
from stepbench.measure.models import build_model
from stepbench.setup import Setup
setup = Setup(mode="eager", attn="sdpa", model="llama-tiny", device="cpu", seq=64).check()
"""
    child = """
    torch.manual_seed(0)
    model = build_model("llama-tiny", 64, "sdpa")
    before = model.get_output_embeddings().weight.detach().clone()
    options.apply_options(model, setup)
    after = model.get_output_embeddings().weight
    other = Setup(mode="eager", attn="eager", model="llama-tiny", device="cpu", seq=64).check()
    torch.manual_seed(0)
    untouched = options.apply_options(build_model("llama-tiny", 64, "sdpa"), other)
    report = {"spoiled": torch.equal(after, before * 64),
              "other_untouched": torch.equal(untouched.get_output_embeddings().weight, before)}
"""
    report = serve(imports, DIVERGE_ENV, "eager+sdpa", child)
    assert report == {"spoiled": True, "other_untouched": True}


@pytest.mark.slow
def test_a_forked_rank_fails_as_it_enters_the_phase_its_own_environment_names(tmp_path):
    imports = """
from stepbench.measure import distributed
"""
    child = f"""
    report = {{}}
    for rank, phase in ((0, "warmup"), (1, "building"), (1, "warmup")):
        state = distributed.RankState({str(tmp_path)!r}, rank)
        try:
            distributed.enter_phase(state, phase, 1, 2)
            report[f"{{rank}} {{phase}}"] = "entered"
        except RuntimeError as exc:
            report[f"{{rank}} {{phase}}"] = str(exc)
    report["state"] = json.loads(open(state.path).read())["phase"]
"""
    report = serve(imports, FAULT_ENV, "1:raise:warmup", child)
    assert report == {"0 warmup": "entered", "1 building": "entered",
                      "1 warmup": "fault injected by the tests on rank 1 in phase warmup",
                      "state": "warmup"}
