"""`stepbench run --max-batch` for real: tiny models in real processes under a real memory cap.

On the CPU --memory-limit-gb caps what each child may add to its address space after its imports
(RLIMIT_AS). With llama-tiny at 128 tokens a 0.21 GB cap lets about 20 sequences fit (8 MB of
address space each); the search starts at 16, so it doubles once, then bisects (about 5 probes and
one full measurement). What it
returns is then checked directly by plain runs into another results file: the batch it chose
fits, and one half again as big does not.

glibc's malloc moves its mmap threshold as large blocks are freed, so where the heap ends up
depends on address-space randomization: identical processes then differ by up to 30 MB of
address space, and a batch at the edge fits in one and not in the next (measured on these
machines). A fixed threshold (MALLOC_MMAP_THRESHOLD_, which the children inherit) makes them
agree to within a megabyte, so the checks below compare like with like.
"""

import json
import math
import os

import pytest

from conftest import read_jsonl, run_cli
from says import lines_naming, names, process_lines

pytestmark = pytest.mark.slow     # every test here starts child processes

SEARCH = ["--device", "cpu", "--modes", "eager", "--attn", "sdpa", "--seq", "128",
          "--memory-limit-gb", "0.21", "--warmup", "2", "--steps", "2", "--repeats", "1"]


@pytest.fixture(scope="module", autouse=True)
def fixed_malloc_threshold():
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("MALLOC_MMAP_THRESHOLD_", "131072")
        yield


@pytest.fixture(scope="module")
def searched(tmp_path_factory):
    out = tmp_path_factory.mktemp("max-batch") / "results.jsonl"
    # Caches of its own: what the probes find there is what this search left.
    caches = tmp_path_factory.mktemp("max-batch-caches")
    proc = run_cli("run", *SEARCH, "--batch", "16", "--max-batch", "--out", out,
                   "--format", "json", check_json=True,
                   env=dict(os.environ, STEPBENCH_CACHE_DIR=str(caches)))
    return proc, out


def test_the_search_measures_the_largest_batch_that_fits(searched):
    proc, out = searched
    records = read_jsonl(out)
    probes = [r for r in records if r["search"]["role"] == "probe"]
    finals = [r for r in records if r["search"]["role"] == "final"]
    assert len(probes) + len(finals) == len(records)
    # --format json prints the full measurements, every attempt, and nothing else.
    assert proc.records == finals
    final = finals[-1]
    assert final["status"] == "ok", final["error"]
    tag = final["search"]
    batch = final["setup"]["batch"]
    assert tag["kind"] == "max_batch" and tag["start_batch"] == 16 and tag["chosen"] == batch
    # Probes: 1 warm-up + 2 timed steps each, starting at 16 and doubling; the full measurement
    # has the run's own steps.
    assert [(p["setup"]["warmup"], p["setup"]["steps"]) for p in probes] == [(1, 2)] * len(probes)
    assert (final["setup"]["warmup"], final["setup"]["steps"]) == (2, 2)
    assert [p["setup"]["batch"] for p in probes][:2] == [16, 32]
    assert tag["probes"] == [[p["setup"]["batch"], p["status"], p["peak_reserved_gb"]]
                             for p in probes]
    assert {p["status"] for p in probes} == {"ok", "oom"}
    # The search bisected until a batch an eighth larger is known not to fit.
    assert 8 <= tag["largest_fit"] <= 40
    assert tag["smallest_oom"] - tag["largest_fit"] <= max(1, tag["largest_fit"] // 8)
    # On the CPU no margin is taken from memory: the largest seen to fit is chosen, unless its
    # full measurement ran out of memory and the search stepped down.
    assert tag["margin"] is None
    assert batch == tag["largest_fit"] or tag["stepped_down_from"]
    assert any(names(line, "max-batch", "eager+sdpa", "seq 128", "largest batch")
               for line in proc.stderr.splitlines())
    # The probes counted no FLOPs (that is the full measurement's, cached per machine for the
    # next search); the full measurement did.
    assert [p["flop_counter_per_step"] for p in probes if p["status"] == "ok"] == \
        [None] * len([p for p in probes if p["status"] == "ok"])
    assert final["flop_counter_per_step"] > 0


def test_the_chosen_batch_fits_and_half_again_as_big_does_not(searched, tmp_path):
    proc, _ = searched
    batch = proc.records[-1]["setup"]["batch"]
    bigger = math.ceil(batch * 1.5)
    check = run_cli("run", *SEARCH, "--batch", f"{batch},{bigger}", "--out",
                    tmp_path / "check.jsonl", "--format", "json", check_json=True)
    assert [(r["setup"]["batch"], r["status"]) for r in check.records] == [
        (batch, "ok"), (bigger, "oom")], [r["error"] for r in check.records]
    assert all("search" not in r for r in check.records)   # plain runs


def test_rerunning_resumes_without_starting_a_process(searched):
    proc, out = searched
    before = read_jsonl(out)
    again = run_cli("run", *SEARCH, "--batch", "16", "--max-batch", "--out", out)
    assert again.returncode == 0, again.stderr
    assert read_jsonl(out) == before
    assert all("skipped" in line for line in process_lines(again.stderr))    # none started
    assert len(lines_naming(again.stderr, "skipped")) == len(before)
    # The same decisions, replayed from the stored probes; the table shows the measurement and
    # the search's details.
    assert lines_naming(again.stderr, "measured", f"batch {proc.records[-1]['setup']['batch']}")
    assert names(again.stdout, "Details: searches", "max_batch probe (double)")


def test_the_report_lists_probes_apart_from_the_results(searched):
    proc, out = searched
    report = json.loads(run_cli("report", out, "--format", "json").stdout)
    final = proc.records[-1]
    assert [(r["setup"], r["batch"]) for r in report["rows"]] == [
        ("eager+sdpa", final["setup"]["batch"])]
    assert len(report["searches"]) == len(read_jsonl(out))


def test_a_probe_that_cannot_run_stops_its_search(tmp_path):
    # flash_attention_2 needs the flash-attn package and a GPU: its first probe is "unsupported",
    # which no batch changes, so the search stops there, says so in one line, and measures
    # nothing. A plan file asks for the search.
    plan = tmp_path / "plan.toml"
    plan.write_text('device = "cpu"\nmax_batch = true\nmemory_limit_gb = 0.21\nsteps = 2\n'
                    '[axes]\nmodes = "eager"\nattn = "flash_attention_2"\nseq = 128\n')
    out = tmp_path / "r.jsonl"
    dry = run_cli("run", "--plan", plan, "--dry-run")
    first = dry.stdout.splitlines()[0]
    assert first.startswith("max-batch ") and names(first, "eager+flash_attention_2", "seq 128")
    assert names(first, "llama-tiny", "bf16", "cpu", "batch 4", "4096")
    # No setup ran ok: exit 1, as for any run (docs/cli.md, "Exit codes").
    proc = run_cli("run", "--plan", plan, "--out", out, "--format", "json", check_json=True,
                   code=1)
    assert proc.records == []
    [probe] = read_jsonl(out)
    assert probe["status"] == "unsupported" and probe["search"]["role"] == "probe"
    [line] = [ln for ln in proc.stderr.splitlines() if "stopped:" in ln]
    assert line.startswith("stepbench") and names(
        line, "max-batch eager+flash_attention_2 at seq 128", "batch 4", "unsupported")


def test_a_search_where_no_batch_fits_exits_1(tmp_path):
    """--memory-limit-gb 0.001: not even the smallest batch fits, so nothing is measured and
    the run ends as a run without an ok setup does (exit 1, one line counting the probes)."""
    out = tmp_path / "r.jsonl"
    proc = run_cli("run", *[a if a != "0.21" else "0.001" for a in SEARCH], "--batch", "1",
                   "--max-batch", "--out", out, "--format", "json", check_json=True, code=1)
    assert proc.records == []
    assert {r["status"] for r in read_jsonl(out)} == {"oom"}
    # The golden of a run's "no setup ran ok" line, word for word.
    assert f"stepbench run: no setup ran ok (1 oom); their errors are in {out}" in proc.stderr
