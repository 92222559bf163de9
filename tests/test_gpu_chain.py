"""The GPU chain (benchmarks/gpu_chain_hf_user_wander.sh) and the wander study it runs: what a
lease would find only when a step's turn came, checked here without starting anything."""

import importlib.util
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CHAIN = ROOT / "benchmarks" / "gpu_chain_hf_user_wander.sh"


def chain_names() -> tuple[set[str], set[str], list[str]]:
    """The chain's known step names, its run_step case labels, and its default STEPS."""
    text = CHAIN.read_text()
    known = set(re.search(r'^known=" ([a-z ]+) "$', text, re.M).group(1).split())
    body = text[text.index("run_step() {"):text.index("\n}\n", text.index("run_step() {"))]
    labels = set(re.findall(r"^    ([a-z]+)\) ", body, re.M))
    default = re.search(r"^steps=\$\{STEPS:-([a-z ]+)\}$", text, re.M).group(1).split()
    return known, labels, default


def test_every_step_the_chain_names_is_one_it_runs():
    known, labels, default = chain_names()
    assert known == labels and set(default) <= known and len(default) == len(set(default))
    # The lease plan in benchmarks/README.md section m3 names only steps the chain knows.
    readme = (ROOT / "benchmarks" / "README.md").read_text()
    plan = readme[readme.index("### m3."):readme.index("### m4.")]
    planned = [w for s in re.findall(r'STEPS="([a-z ]+)"', plan) for w in s.split()]
    assert planned and set(planned) <= known


def test_the_wander_resolves_seed_against_the_callers_folder(tmp_path, monkeypatch):
    spec = importlib.util.spec_from_file_location("gpu_wander", ROOT / "benchmarks" / "gpu_wander.py")
    wander = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(wander)
    (tmp_path / "anchors").mkdir()
    (tmp_path / "anchors" / "seed_train.py").write_text("")
    monkeypatch.chdir(tmp_path)
    seed = Path(wander.seed_path("anchors/seed_train.py"))
    # The script's processes start in ROOT: the path must still name the caller's file there.
    assert seed.is_absolute() and (ROOT / seed).is_file()
    assert seed == tmp_path / "anchors" / "seed_train.py"


@pytest.mark.slow
def test_the_chain_runs_its_own_copy_of_seed(tmp_path):
    """A device call that does not carry SEED's ignored folder removes it from the working tree
    while the setsid chain runs (the 2026-12-05 lease lost the script's side so): the chain
    copies SEED into JOB before any step and names the copy."""
    import os
    import subprocess

    seed = tmp_path / "anchors" / "seed_train.py"
    seed.parent.mkdir()
    seed.write_text("print('the post script')\n")
    job = tmp_path / "job"
    env = {**os.environ, "STEPS": " ", "JOB": str(job), "SEED": str(seed)}
    subprocess.run(["bash", str(CHAIN)], cwd=ROOT, env=env, check=True, timeout=120,
                   capture_output=True)
    copy = job / "seed_script.py"
    assert copy.read_text() == seed.read_text() and (job / "done").is_file()
    assert f"SEED={copy} " in (job / "steps.txt").read_text()
