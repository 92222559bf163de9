"""stepbench's own caches (measure/cache.py): the GPU's matmul rate and FLOP counts per shape.

An entry is used only for its exact key and within its age; anything stale, foreign, damaged or
invalid is measured again, and a cache that cannot be written never fails a measurement.
"""

import json
from datetime import datetime, timedelta, timezone

import pytest

from stepbench.measure import cache
from stepbench.measure.cache import JsonCache, positive_number
from says import names

KEY = {"gpu": "NVIDIA H200", "driver": "580.95", "torch": "2.11.0+cu130", "cuda": "13.0",
       "dtype": "bf16", "n": 8192, "repeats": 20}


@pytest.fixture
def folder(tmp_path, monkeypatch):
    monkeypatch.setenv(cache.CACHE_ENV, str(tmp_path))
    return tmp_path


class Measure:
    """A measurement that counts its calls and returns a new value each time."""

    def __init__(self, value=790.0):
        self.calls, self.value = 0, value

    def __call__(self):
        self.calls += 1
        return self.value + self.calls


def fetch(peaks, key=KEY, measure=None):
    return peaks.fetch(key, measure, valid=positive_number)


def test_a_fresh_matching_entry_is_used_and_not_measured_again(folder):
    peaks, measure = JsonCache("peaks", max_age=timedelta(days=7)), Measure()
    first, at = fetch(peaks, measure=measure)
    assert (first, measure.calls) == (791.0, 1)
    assert fetch(peaks, dict(KEY), measure) == (791.0, at)
    assert measure.calls == 1
    stored = json.loads((folder / "peaks.json").read_text())
    assert stored["entries"] == [{"key": KEY, "value": 791.0, "measured_at": at}]


def test_a_stale_entry_is_measured_again_and_replaced(folder):
    peaks, measure = JsonCache("peaks", max_age=timedelta(days=7)), Measure()
    eight_days_ago = datetime.now(timezone.utc) - timedelta(days=8)
    peaks.put(KEY, 700.0, measured_at=eight_days_ago)
    value, at = fetch(peaks, measure=measure)
    assert (value, measure.calls) == (791.0, 1)
    assert datetime.fromisoformat(at) > eight_days_ago + timedelta(days=7)
    entries = json.loads((folder / "peaks.json").read_text())["entries"]
    assert [e["value"] for e in entries] == [791.0]      # the stale one is replaced, not kept
    # Six days old is within the week.
    peaks.put(KEY, 700.0, measured_at=datetime.now(timezone.utc) - timedelta(days=6))
    assert fetch(peaks, measure=measure)[0] == 700.0 and measure.calls == 1


@pytest.mark.parametrize("field,other", [("gpu", "NVIDIA H100 80GB HBM3"), ("driver", "590.1"),
                                         ("torch", "2.13.0+cu130"), ("dtype", "fp32")])
def test_a_foreign_entry_is_ignored(folder, field, other):
    # Another GPU, driver, torch or dtype: that machine's rate says nothing about this one.
    peaks, measure = JsonCache("peaks", max_age=timedelta(days=7)), Measure()
    peaks.put({**KEY, field: other}, 500.0)
    assert fetch(peaks, measure=measure)[0] == 791.0 and measure.calls == 1
    # Both entries are kept: each machine finds its own.
    assert fetch(peaks, {**KEY, field: other}, measure)[0] == 500.0
    assert len(json.loads((folder / "peaks.json").read_text())["entries"]) == 2


def test_an_entry_from_the_future_or_without_a_zone_is_ignored(folder):
    peaks, measure = JsonCache("peaks", max_age=timedelta(days=7)), Measure()
    peaks.put(KEY, 600.0, measured_at=datetime.now(timezone.utc) + timedelta(days=1))
    assert fetch(peaks, measure=measure)[0] == 791.0
    data = json.loads((folder / "peaks.json").read_text())
    data["entries"][0]["measured_at"] = datetime.now().isoformat()      # naive: no zone
    data["entries"][0]["value"] = 600.0
    (folder / "peaks.json").write_text(json.dumps(data))
    assert fetch(peaks, measure=measure)[0] == 792.0 and measure.calls == 2


@pytest.mark.parametrize("content", ["{not json", "[1, 2]", '{"version": 99, "entries": []}',
                                     '{"version": 1, "entries": "x"}', "\udcff"])
def test_a_damaged_file_is_ignored_and_rewritten(folder, capsys, content):
    path = folder / "peaks.json"
    path.write_text(content, errors="surrogateescape")
    peaks, measure = JsonCache("peaks", max_age=timedelta(days=7)), Measure()
    assert fetch(peaks, measure=measure)[0] == 791.0
    assert json.loads(path.read_text())["entries"][0]["value"] == 791.0
    assert fetch(peaks, measure=measure)[0] == 791.0 and measure.calls == 1


@pytest.mark.parametrize("bad", [-1.0, 0, "790", None, True])
def test_an_invalid_value_is_measured_again(folder, bad):
    peaks, measure = JsonCache("peaks", max_age=timedelta(days=7)), Measure()
    peaks.put(KEY, bad)
    assert fetch(peaks, measure=measure)[0] == 791.0 and measure.calls == 1


def test_without_a_key_it_measures_and_stores_nothing(folder):
    # The driver cannot be named (NVML off): a driver upgrade would go unseen, so no caching.
    peaks, measure = JsonCache("peaks", max_age=timedelta(days=7)), Measure()
    assert fetch(peaks, None, measure)[0] == 791.0
    assert fetch(peaks, None, measure)[0] == 792.0
    assert not (folder / "peaks.json").exists()


def test_the_peak_key_needs_the_driver(folder, monkeypatch):
    from stepbench.measure import peaks

    monkeypatch.setenv("STEPBENCH_NVML", "0")
    assert peaks.peak_cache_key("bf16") is None


def test_cached_only_reads_a_valid_fresh_entry_and_never_measures_or_stores(folder):
    peaks = JsonCache("peaks", max_age=timedelta(days=7))

    def refuse():
        raise AssertionError("cached_only measured")

    assert peaks.fetch(KEY, refuse, valid=positive_number, cached_only=True) is None
    assert peaks.fetch(None, refuse, cached_only=True) is None
    assert not (folder / "peaks.json").exists()
    peaks.put(KEY, -1.0)                                   # invalid: as if absent
    assert peaks.fetch(KEY, refuse, valid=positive_number, cached_only=True) is None
    peaks.put(KEY, 700.0, measured_at=datetime.now(timezone.utc) - timedelta(days=8))
    assert peaks.fetch(KEY, refuse, valid=positive_number, cached_only=True) is None
    at = peaks.put(KEY, 790.0)
    assert peaks.fetch(KEY, refuse, valid=positive_number, cached_only=True) == (790.0, at)


def test_a_probe_takes_the_matmul_rate_from_the_cache_or_goes_without(folder, monkeypatch):
    # What a search's probe asks (measure=False): never a measurement; with no key (no driver),
    # none; with a cached rate for this GPU's key, that rate.
    from stepbench.measure import peaks

    def refuse(*args):
        raise AssertionError("a probe measured the matmul rate")

    monkeypatch.setattr(peaks, "measure_matmul_tflops", refuse)
    monkeypatch.setattr(peaks, "PEAK_CACHE", JsonCache("peaks", max_age=timedelta(days=7)))
    monkeypatch.setattr(peaks, "peak_cache_key", lambda dtype, index=0: None)
    assert peaks.cached_matmul_tflops("bf16", measure=False) is None
    monkeypatch.setattr(peaks, "peak_cache_key", lambda dtype, index=0: KEY)
    assert peaks.cached_matmul_tflops("bf16", measure=False) is None
    peaks.PEAK_CACHE.put(KEY, 791.0)
    tflops, at = peaks.cached_matmul_tflops("bf16", measure=False)
    assert tflops == 791.0 and at


def test_an_unwritable_cache_never_fails_the_measurement(tmp_path, monkeypatch, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv(cache.CACHE_ENV, str(blocker / "sub"))   # a folder under a file
    value, at = fetch(JsonCache("peaks"), measure=Measure())
    assert value == 791.0 and at
    assert names(capsys.readouterr().err, "peaks cache")


def test_the_folder_follows_the_environment(tmp_path, monkeypatch):
    monkeypatch.delenv(cache.CACHE_ENV, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert cache.cache_dir() == tmp_path / "stepbench"
    monkeypatch.setenv(cache.CACHE_ENV, str(tmp_path / "mine"))
    assert cache.cache_dir() == tmp_path / "mine"


def test_flops_are_counted_once_per_model_shape(folder):
    # A real tiny model: the first call counts, the second reads the cache (proven by a value
    # no count gives), and another sequence length is another key.
    import torch

    from stepbench.measure import step
    from stepbench.setup import Setup

    setup = Setup(model="llama-tiny", mode="eager", attn="sdpa", batch=2, seq=32, device="cpu")
    model, _, tokens, _ = step.build(setup, torch.device("cpu"))
    path = folder / "flops.json"
    # A search's probe counts nothing: the cached count or none.
    assert step.flop_counter_per_sequence(setup, model, tokens, count=False) is None
    assert not path.exists()
    counted = step.flop_counter_per_sequence(setup, model, tokens)
    assert counted > 1e6
    assert step.flop_counter_per_sequence(setup, model, tokens, count=False) == counted
    data = json.loads(path.read_text())
    assert [e["value"] for e in data["entries"]] == [counted]
    assert data["entries"][0]["key"]["seq"] == 32 and data["entries"][0]["key"]["attn"] == "sdpa"
    data["entries"][0]["value"] = 12345.0
    path.write_text(json.dumps(data))
    assert step.flop_counter_per_sequence(setup, model, tokens) == 12345.0
    # Batch, mode and dtype do not change the key; the sequence length does.
    other_batch = Setup(**{**setup.__dict__, "batch": 4, "mode": "compile"})
    assert step.flop_counter_per_sequence(other_batch, model, tokens) == 12345.0
    longer = Setup(**{**setup.__dict__, "seq": 64})
    tokens64 = torch.randint(0, 4096, (1, 64))
    assert step.flop_counter_per_sequence(longer, model, tokens64) > counted
    assert len(json.loads(path.read_text())["entries"]) == 2


def run_python(code: str) -> list[str]:
    import os
    import subprocess
    import sys

    from conftest import SRC

    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": SRC}, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.split()


@pytest.mark.slow
def test_a_resumed_run_imports_neither_torch_nor_transformers(tmp_path):
    # The parent needs neither (about 5 s of every command on a GPU host): the device is told from
    # torch/version.py and NVML, a preset needs no config check, and here every setup is done.
    import shutil

    from test_compat import V01

    out = tmp_path / "r.jsonl"
    shutil.copy(V01 / "cpu-results.jsonl", out)
    code = ("import sys; from stepbench.cli import main; "
            f"code = main(['run', '--device', 'auto', '--seq', '64', '--warmup', '1', '--steps', '3', "
            f"'--attn', 'sdpa', '--repeats', '1', '--out', {str(out)!r}, '--format', 'markdown']); "
            "print('RESULT', code, 'torch' in sys.modules, 'transformers' in sys.modules)")
    words = run_python(code)
    assert words[words.index("RESULT"):] == ["RESULT", "0", "False", "False"]


@pytest.mark.slow
def test_the_device_is_told_without_importing_torch():
    code = ("import sys; from stepbench.measure.machine import resolve_device, _torch_cuda_version; "
            "device, imported, told = resolve_device('auto'), 'torch' in sys.modules, "
            "_torch_cuda_version(); import torch; "
            "print(device, imported, repr(told) == repr(torch.version.cuda), torch.cuda.is_available())")
    assert run_python(code) == ["cpu", "False", "True", "False"]
