"""Two runs on one results file never measure a setup twice (claims.py, issue 37 item 5).

The interleavings are driven here in one process, in the order that goes wrong, rather than
hoped for by timing: another run is a claim file holding a live pid that is not this one, or a
second Runner (fakes.InProcess, no child process) that finishes between two steps of the first.
test_run_outcomes.py runs two real `stepbench run`s on one file.
"""

import json
import os
import threading

from stepbench import claims
from stepbench.record import ResultsFile

from says import names
from test_record_store import a_record


def _claim_of(store: ResultsFile, key: str, pid: int) -> None:
    """A claim file as another run on this host writes it (claims.py)."""
    path = store.claims._path(key)
    path.parent.mkdir(exist_ok=True)
    path.write_text(json.dumps({"pid": pid, "host": os.uname().nodename, "key": key}))


def test_a_run_waits_for_another_live_runs_record_instead_of_measuring_it(tmp_path, monkeypatch):
    monkeypatch.setattr(claims, "CLAIM_POLL_S", 0.05)
    store = ResultsFile(tmp_path / "r.jsonl")
    record = a_record()
    key = record.resume_key()
    _claim_of(store, key, os.getppid())          # a live process that is not this one
    said = []
    later = threading.Timer(0.3, lambda: ResultsFile(store.path).append(record))
    later.start()
    found = store.claims.claim(key, said.append, "eager+sdpa batch 1 seq 64 (repeat 0)")
    later.join()
    assert found is not None and found.resume_key() == key
    # the other run's pid, the measurement it holds, the file
    assert len(said) == 1 and names(said[0], f"(pid {os.getppid()})",
                                    "eager+sdpa batch 1 seq 64 (repeat 0)", str(store.path))
    # The golden of the claim-wait line, word for word.
    assert said[0] == (f"another stepbench run (pid {os.getppid()}) is measuring eager+sdpa batch "
                       f"1 seq 64 (repeat 0) into {store.path}; waiting for its record")


def test_a_claim_of_a_process_that_is_gone_is_taken_over_and_released(tmp_path):
    store = ResultsFile(tmp_path / "r.jsonl")
    key = a_record().resume_key()
    _claim_of(store, key, 4194304 + 17)          # above any pid_max: no such process
    said = []
    assert store.claims.claim(key, said.append) is None and said == []
    assert json.loads(store.claims._path(key).read_text())["pid"] == os.getpid()
    store.claims.release(key)
    assert not store.claims.folder.exists()      # the last claim gone, its folder too
