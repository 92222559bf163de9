"""Two runs on one results file never measure a setup twice (claims.py, issue 37 item 5).

The interleavings are driven here in one process, in the order that goes wrong, rather than
hoped for by timing: another run is a claim file holding a live pid that is not this one, or a
second Runner (fakes.InProcess, no child process) that finishes between two steps of the first.
test_run_outcomes.py runs two real `stepbench run`s on one file.
"""

import errno
import fcntl
import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from stepbench import claims
from stepbench.execute.runner import Runner
from stepbench.record import ResultsFile
from stepbench.setup import Setup

from conftest import SRC
from fakes import InProcess
from says import names
from test_record_store import a_record


def by_key(key: str):
    """The match a run on this machine makes (Executor.find_done): the last record whose resume
    key is `key`."""
    return lambda records: next((r for r in reversed(records) if r.resume_key() == key), None)


def _claim_file(store: ResultsFile, key: str, pid: int) -> None:
    """A claim file naming `pid` on this host, as a run writes it (claims.py), whose lock no
    process holds: the file of a run that is gone."""
    path = store.claims._path(key)
    path.parent.mkdir(exist_ok=True)
    path.write_text(json.dumps({"pid": pid, "host": os.uname().nodename, "key": key}))


def _claim_of(store: ResultsFile, key: str, pid: int) -> int:
    """Another live run's claim: its file, and its lock held on a descriptor of its own (the
    kernel's flock tells descriptors apart, not processes). The caller closes it."""
    _claim_file(store, key, pid)
    fd = os.open(store.claims._path(key), os.O_RDWR)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    return fd


def test_a_run_waits_for_another_live_runs_record_instead_of_measuring_it(tmp_path, monkeypatch):
    monkeypatch.setattr(claims, "CLAIM_POLL_S", 0.05)
    store = ResultsFile(tmp_path / "r.jsonl")
    record = a_record()
    key = record.resume_key()
    held = _claim_of(store, key, os.getppid())   # a live process that is not this one
    said = []
    later = threading.Timer(0.3, lambda: ResultsFile(store.path).append(record))
    later.start()
    found = store.claims.claim(key, said.append, "eager+sdpa batch 1 seq 64 (repeat 0)",
                               match=by_key(key))
    later.join()
    os.close(held)
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
    _claim_file(store, key, 4194304 + 17)        # above any pid_max: no such process
    said = []
    assert store.claims.claim(key, said.append, match=by_key(key)) is None and said == []
    assert json.loads(store.claims._path(key).read_text())["pid"] == os.getpid()
    store.claims.release(key)
    assert not store.claims.folder.exists()      # the last claim gone, its folder too


def test_a_setup_another_run_stored_after_this_run_read_the_file_is_not_measured_again(
        tmp_path, monkeypatch):
    """CI's failure: the second run read which setups were done, then the first appended batch
    1's record and released its claim, then the second claimed batch 1, found no claim and
    measured it again. Holding the claim, a run looks for a record appended since its read."""
    out = tmp_path / "r.jsonl"
    plan = [Setup(model="llama-tiny", mode="eager", attn="sdpa", batch=b, seq=64, device="cpu")
            for b in (1, 2)]
    first, second = InProcess(lambda job: [10.0]), InProcess(lambda job: [20.0])
    store = ResultsFile(out)
    read = store.latest

    def read_then_the_first_run_stores_batch_1(*args, **kwargs):
        records = read(*args, **kwargs)
        Runner(first, ResultsFile(out), run_id="first").run(plan[:1], timeout_s=60)
        return records

    monkeypatch.setattr(store, "latest", read_then_the_first_run_stores_batch_1)
    records = Runner(second, store, run_id="second").run(plan, timeout_s=60)
    assert first.ran == [(1, 0)] and second.ran == [(2, 0)]
    assert [(r.setup.batch, r.run_id) for r in records] == [(1, "first"), (2, "second")]
    stored = [json.loads(line) for line in out.read_text().splitlines()]
    assert sorted((r["setup"]["batch"], r["run_id"]) for r in stored) == [(1, "first"),
                                                                         (2, "second")]
    assert not store.claims.folder.exists()


def test_a_rerun_waiting_for_another_runs_record_takes_the_new_one_not_the_old(
        tmp_path, monkeypatch):
    """Two `--rerun`s at once: the one that waits takes the other's new record, not the record
    both were told to measure again (it lies before where the waiting run read the file)."""
    monkeypatch.setattr(claims, "CLAIM_POLL_S", 0.05)
    store = ResultsFile(tmp_path / "r.jsonl")
    store.append(a_record(run_id="old"))
    since = store.end()
    key = a_record().resume_key()
    held = _claim_of(store, key, os.getppid())
    later = threading.Timer(0.3, lambda: ResultsFile(store.path).append(a_record(run_id="new")))
    later.start()
    found = store.claims.claim(key, lambda text: None, since=since, match=by_key(key))
    later.join()
    assert found is not None and found.run_id == "new"
    # Nothing after `since` and no claim: this run measures it (the old record does not count).
    store.claims._path(key).unlink()
    os.close(held)
    assert store.claims.claim(key, lambda text: None, since=store.end(),
                              match=by_key(key)) is None
    store.claims.release(key)


def test_a_claim_whose_folder_another_run_removed_after_mkdir_is_made_again(tmp_path,
                                                                           monkeypatch):
    """The other run's release removes the emptied claims folder between this run's mkdir and
    its O_EXCL open: the claim is made again, not given up (measuring unclaimed)."""
    store = ResultsFile(tmp_path / "r.jsonl")
    key = a_record().resume_key()

    class VanishingFolder:      # claims.py's os, whose first open finds the folder gone
        first = True

        def __getattr__(self, name):
            return getattr(os, name)

        def open(self, path, *args):
            if VanishingFolder.first:
                VanishingFolder.first = False
                store.claims.folder.rmdir()
            return os.open(path, *args)

    monkeypatch.setattr(claims, "os", VanishingFolder())
    assert store.claims.claim(key, lambda text: None, match=by_key(key)) is None
    monkeypatch.undo()
    assert not VanishingFolder.first
    assert json.loads(store.claims._path(key).read_text())["pid"] == os.getpid()
    store.claims.release(key)


@pytest.fixture
def no_flock(monkeypatch):
    """A filesystem that refuses flock (NFS without a lock manager): claims.py's fcntl says
    ENOLCK."""
    class NoFlock:
        def __getattr__(self, name):
            return getattr(fcntl, name)

        def flock(self, fd, operation):
            raise OSError(errno.ENOLCK, os.strerror(errno.ENOLCK))

    monkeypatch.setattr(claims, "fcntl", NoFlock())


@pytest.mark.timeout(30)
def test_a_claim_file_left_empty_is_taken_over_once_it_is_old(tmp_path, no_flock):
    """Without flock, a run that died between making its claim file and writing it (or a full
    disk) leaves it empty: once older than UNWRITTEN_S it is stale, not waited on for ever.
    (With flock, no lock on it is enough.)"""
    store = ResultsFile(tmp_path / "r.jsonl")
    key = a_record().resume_key()
    path = store.claims._path(key)
    path.parent.mkdir()
    path.touch()
    then = time.time() - claims.UNWRITTEN_S - 5
    os.utime(path, (then, then))
    assert store.claims.claim(key, lambda text: None, match=by_key(key)) is None
    assert json.loads(path.read_text())["pid"] == os.getpid()
    store.claims.release(key)


def test_a_cluster_runs_claim_finds_the_record_by_the_executors_match(tmp_path):
    """On Ray or Slurm the claim's key names the GPU type asked for (none: any), the record the
    GPU the job got: the record is found by the executor's own match (clusters.find_done), so a
    run that claims after another stored the setup takes that record instead of measuring."""
    import dataclasses

    from stepbench.execute.clusters import find_done
    from stepbench.execute.protocol import Job
    from stepbench.record import Machine, resume_key

    store = ResultsFile(tmp_path / "r.jsonl")
    since = store.end()
    theirs = dataclasses.replace(a_record(), machine=Machine(gpu="NVIDIA H200"),
                                 placement={"ray": {"gpu_type": None, "node": "n1"}})
    ResultsFile(store.path).append(theirs)            # the other run's, since this one read
    job = Job(theirs.setup, 0)
    key = resume_key(job.setup, job.repeat, None)     # what a cluster run claims
    assert key != theirs.resume_key()                 # by key alone it would be measured again
    assert store.claims.claim(key, print, since=since, match=by_key(key)) is None
    store.claims.release(key)
    found = store.claims.claim(key, print, since=since,
                               match=lambda records: find_done(job, records, "ray", None))
    assert found is not None and found.machine.gpu == "NVIDIA H200"
    assert not store.claims.folder.exists()           # taken, and its claim released


def _waiting(said: list, done: list, count: int, seconds: float = 10) -> None:
    """Until `count` claimants said they wait, or came back (they did not wait)."""
    deadline = time.monotonic() + seconds
    while len(said) + len(done) < count and time.monotonic() < deadline:
        time.sleep(0.01)


def test_three_runs_claiming_one_setup_measure_it_once(tmp_path, monkeypatch):
    """Three runs (three stores on one file, as three `stepbench run`s have) want one setup at
    once: the first measures it, the two others wait and take its record."""
    monkeypatch.setattr(claims, "CLAIM_POLL_S", 0.02)
    path = tmp_path / "r.jsonl"
    record = a_record()
    key = record.resume_key()
    first = ResultsFile(path)
    assert first.claims.claim(key, print, match=by_key(key)) is None    # the first measures it
    said, done = [], []

    def run():
        done.append(ResultsFile(path).claims.claim(key, said.append, "eager+sdpa batch 1",
                                                   match=by_key(key)))

    others = [threading.Thread(target=run, daemon=True) for _ in range(2)]
    for thread in others:
        thread.start()
    _waiting(said, done, 2)
    first.append(record)                                         # its record, then its release
    first.claims.release(key)
    for thread in others:
        thread.join(10)
    assert [found is not None and found.resume_key() == key for found in done] == [True, True]
    assert len(said) == 2 and all(names(line, f"(pid {os.getpid()})", "eager+sdpa batch 1")
                                  for line in said)
    assert len(path.read_text().splitlines()) == 1               # measured and stored once
    assert not first.claims.folder.exists()


def test_a_claim_file_left_by_a_dead_run_is_taken_though_its_pid_lives_again(tmp_path,
                                                                             monkeypatch):
    """The run that wrote it is gone and its pid now belongs to another process (reused): no
    lock is held on the file, so it is no claim, and the next run takes it at once."""
    monkeypatch.setattr(claims, "CLAIM_POLL_S", 0.02)
    store = ResultsFile(tmp_path / "r.jsonl")
    key = a_record().resume_key()
    _claim_file(store, key, os.getppid())        # a live pid: the dead run's, reused
    said, done = [], []
    taking = threading.Thread(target=lambda: done.append(store.claims.claim(key, said.append,
                                                                         match=by_key(key))),
                              daemon=True)
    taking.start()
    taking.join(5)
    assert done == [None] and said == []
    assert json.loads(store.claims._path(key).read_text())["pid"] == os.getpid()
    store.claims.release(key)
    assert not store.claims.folder.exists()


def test_without_flock_a_live_pids_claim_is_waited_for_and_a_dead_ones_taken(
        tmp_path, monkeypatch, no_flock):
    monkeypatch.setattr(claims, "CLAIM_POLL_S", 0.02)
    store = ResultsFile(tmp_path / "r.jsonl")
    record = a_record()
    key = record.resume_key()
    _claim_file(store, key, os.getppid())        # no lock to hold: the pid is the claim
    said = []
    later = threading.Timer(0.2, lambda: ResultsFile(store.path).append(record))
    later.start()
    found = store.claims.claim(key, said.append, since=store.end(), match=by_key(key))
    later.join()
    assert found is not None and names(said[0], f"(pid {os.getppid()})")
    _claim_file(store, key, 4194304 + 17)
    assert store.claims.claim(key, said.append, since=store.end(),
                              match=by_key(key)) is None and len(said) == 1
    assert json.loads(store.claims._path(key).read_text())["pid"] == os.getpid()
    store.claims.release(key)
    assert not store.claims.folder.exists()


_HOLDER = """
import sys, time
from pathlib import Path
from stepbench.record import ResultsFile
key = sys.argv[2]
mine = lambda records: next((r for r in records if r.resume_key() == key), None)
assert ResultsFile(Path(sys.argv[1])).claims.claim(key, print, match=mine) is None
print("holding", flush=True)
time.sleep(120)
"""


@pytest.mark.slow
def test_a_claim_of_a_run_killed_by_sigkill_is_taken_at_once(tmp_path, monkeypatch):
    """A run holding a claim is SIGKILLed: its lock goes with it, before anyone reaps it (a
    zombie's pid still answers kill(pid, 0)), so of the two runs waiting for it one takes the
    claim and measures, and the other takes that one's record."""
    monkeypatch.setattr(claims, "CLAIM_POLL_S", 0.02)
    path = tmp_path / "r.jsonl"
    record = a_record()
    key = record.resume_key()
    holder = subprocess.Popen([sys.executable, "-c", _HOLDER, str(path), key], text=True,
                              stdout=subprocess.PIPE, env=dict(os.environ, PYTHONPATH=SRC))
    try:
        assert holder.stdout.readline() == "holding\n"
        said, done = [], []

        def run():
            store = ResultsFile(path)
            found = store.claims.claim(key, said.append, match=by_key(key))
            if found is None:                    # measured here
                store.append(record)
                store.claims.release(key)
            done.append(found)

        waiters = [threading.Thread(target=run, daemon=True) for _ in range(2)]
        for thread in waiters:
            thread.start()
        _waiting(said, done, 2)
        assert done == [] and len(said) == 2 and all(names(line, f"(pid {holder.pid})")
                                                     for line in said)
        os.kill(holder.pid, signal.SIGKILL)      # not reaped until holder.wait() below
        for thread in waiters:
            thread.join(5)
        assert len(done) == 2 and done.count(None) == 1
        assert len(path.read_text().splitlines()) == 1
        assert not path.with_name(path.name + ".claims").exists()
    finally:
        holder.kill()
        holder.wait()
