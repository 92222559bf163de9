"""The results file is never damaged and never damages a record (record.ResultsFile).

Failures are real, not mocked: a full tmpfs in a mount namespace of its own (`unshare -rm`), a
write past RLIMIT_FSIZE in a child process, two processes appending at once, and the CLI stopped
by a results file that cannot take the next record.
"""

import dataclasses
import fcntl
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from stepbench.record import Machine, Record, ResultsFile, Software
from stepbench.setup import Setup

from conftest import SRC

from says import error_line, names

ENV = dict(os.environ,
           PYTHONPATH=os.pathsep.join(filter(None, [SRC, os.environ.get("PYTHONPATH")])),
           PYTHONDONTWRITEBYTECODE="1")   # no .pyc writes under a file size limit


def a_record(batch: int = 1, run_id: str = "r1", error_chars: int = 0) -> Record:
    setup = Setup(model="llama-tiny", mode="eager", attn="sdpa", batch=batch, seq=64, device="cpu")
    return Record(run_id=run_id, repeat=0, setup=setup, status="ok" if not error_chars else "error",
                  error="x" * error_chars or None, step_ms=10.0 * batch,
                  machine=Machine(gpu="cpu", hostname="test"))


def line_of(record: Record) -> bytes:
    return (json.dumps(record.to_dict()) + "\n").encode()


def python(script: str, *args, timeout_s: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", script, *map(str, args)], capture_output=True,
                          text=True, env=ENV, timeout=timeout_s)


# ---------------------------------------------------------------- a cut-off last line

def test_an_append_after_a_cut_off_last_line_starts_a_line_of_its_own(tmp_path):
    out = tmp_path / "r.jsonl"
    whole = line_of(a_record(1))
    cut = line_of(a_record(2))[:150]          # half a record, no newline: a crash mid-write
    out.write_bytes(whole + cut)
    store = ResultsFile(out)
    store.append(a_record(3))
    assert out.read_bytes() == whole + cut + b"\n" + line_of(a_record(3))
    store.append(a_record(4))                 # and the next one follows as usual
    warnings = []
    assert [r.setup.batch for r in store.read(warnings.append)] == [1, 3, 4]
    assert len(warnings) == 1
    assert warnings[0].startswith(f"{out}:2: ") and names(warnings[0], "skipped", "JSON")


# ---------------------------------------------------------------- a record missing a field

def test_a_record_without_a_required_field_names_the_field(tmp_path):
    data = a_record().to_dict()
    del data["repeat"]
    with pytest.raises(ValueError, match=r"^missing field 'repeat'$"):
        Record.from_dict(data)
    del data["run_id"]
    with pytest.raises(ValueError, match=r"^missing fields 'run_id', 'repeat'$"):
        Record.from_dict(data)
    out = tmp_path / "r.jsonl"
    no_repeat = a_record(3).to_dict()
    del no_repeat["repeat"]
    out.write_bytes(line_of(a_record(1)) + line_of(a_record(2))
                    + (json.dumps(no_repeat) + "\n").encode())
    warnings = []
    assert [r.setup.batch for r in ResultsFile(out).read(warnings.append)] == [1, 2]
    # The golden of a skipped line's warning, word for word.
    assert warnings == [f"{out}:3: skipped a record (missing field 'repeat')"]


# ---------------------------------------------------------------- a write that fails part-way

# Appends one record to the file under a file size limit that ends in the middle of its line;
# prints the error's message.
APPEND_PAST_LIMIT = """
import resource, signal, sys
from stepbench.record import Machine, Record, ResultsFile, ResultsFileError
from stepbench.setup import Setup
# CPython ignores SIGXFSZ from start-up, so the write raises EFBIG instead of the signal killing
# the process; stepbench's append relies on it (record.ResultsFile.append).
assert signal.getsignal(signal.SIGXFSZ) == signal.SIG_IGN
resource.setrlimit(resource.RLIMIT_FSIZE, (int(sys.argv[2]), int(sys.argv[2])))
setup = Setup(model="llama-tiny", mode="eager", attn="sdpa", batch=9, seq=64, device="cpu")
try:
    ResultsFile(sys.argv[1]).append(Record(run_id="r1", repeat=0, setup=setup, status="ok",
                                           machine=Machine(gpu="cpu")))
except ResultsFileError as exc:
    print(exc)
"""


@pytest.mark.slow
def test_a_write_past_the_file_size_limit_leaves_the_file_as_it_was(tmp_path):
    out = tmp_path / "r.jsonl"
    before = line_of(a_record(1)) + line_of(a_record(2)) + line_of(a_record(3))[:100]  # cut off
    out.write_bytes(before)
    limit_bytes = len(before) + 300           # in the middle of the next record (and its "\n")
    assert len(line_of(a_record(9))) > 600
    proc = python(APPEND_PAST_LIMIT, out, limit_bytes)
    assert proc.returncode == 0, proc.stderr
    # The golden of a failed append, word for word.
    assert proc.stdout.strip() == (
        f"cannot append to {out}: File too large (the file is as it was before this record; raise "
        "the file size limit (ulimit -f) or pass another --out and run the same command again "
        "to resume)")
    assert out.read_bytes() == before         # the newline it put first is gone too
    ResultsFile(out).append(a_record(4))
    assert [r.setup.batch for r in ResultsFile(out).read(lambda message: None)] == [1, 2, 4]


# Under a tmpfs of 64 KiB: appends records until one fails, then copies the file out of the
# mount namespace (which goes with this process) and prints what happened.
FILL_THE_DISK = """
import json, shutil, sys
from stepbench.record import Machine, Record, ResultsFile, ResultsFileError
from stepbench.setup import Setup
store, copy = ResultsFile(sys.argv[1]), sys.argv[2]
setup = Setup(model="llama-tiny", mode="eager", attn="sdpa", batch=1, seq=64, device="cpu")
appended = 0
try:
    while appended < 1000:
        store.append(Record(run_id="r1", repeat=appended, setup=setup, status="error",
                            error="x" * 3000, machine=Machine(gpu="cpu")))
        appended += 1
    message = None
except ResultsFileError as exc:
    message = str(exc)
shutil.copyfile(sys.argv[1], copy)
print(json.dumps({"appended": appended, "message": message}))
"""


@pytest.fixture(scope="module")
def small_tmpfs(tmp_path_factory):
    """A command prefix that runs its command with a 64 KiB tmpfs mounted on the folder it
    names, in a user and mount namespace of its own; skips where that is not permitted."""
    if shutil.which("unshare") is None:
        pytest.skip("no unshare (util-linux) here: the full-disk test needs it")
    probe = tmp_path_factory.mktemp("probe")
    try:
        proc = subprocess.run(["unshare", "-rm", "sh", "-c",
                               f"mount -t tmpfs -o size=64k tmpfs {probe}"],
                              capture_output=True, text=True, timeout=30)
    except OSError as exc:
        pytest.skip(f"cannot start unshare ({exc})")
    if proc.returncode != 0:
        pytest.skip("a user and mount namespace with a tmpfs is not permitted here (unshare -rm: "
                    f"{proc.stderr.strip()}); the full-disk test needs it")

    def run(folder: Path, *command) -> subprocess.CompletedProcess:
        script = 'mount -t tmpfs -o size=64k tmpfs "$1" && shift && exec "$@"'
        return subprocess.run(["unshare", "-rm", "sh", "-c", script, "sh", str(folder),
                               *map(str, command)], capture_output=True, text=True, env=ENV,
                              timeout=120)
    return run


@pytest.mark.slow
def test_a_full_disk_leaves_every_earlier_record_intact(tmp_path, small_tmpfs):
    disk, copy = tmp_path / "disk", tmp_path / "kept.jsonl"
    disk.mkdir()
    out = disk / "results.jsonl"
    proc = small_tmpfs(disk, sys.executable, "-c", FILL_THE_DISK, out, copy)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert 5 < result["appended"] < 1000       # the disk filled up, after some records
    # the file, the system's reason, what to do and that the same command resumes
    assert names(result["message"], str(out), "No space left on device", "free space", "resume")
    kept = copy.read_bytes()
    assert kept.endswith(b"\n")
    lines = kept.decode().splitlines()
    assert [json.loads(line)["repeat"] for line in lines] == list(range(result["appended"]))


# ---------------------------------------------------------------- other processes

# Waits for a line on stdin, then appends 200 records of about 70 kB each (over a pipe's 64 KiB
# and PIPE_BUF), numbered and tagged with this process's name.
APPEND_MANY = """
import sys
from stepbench.record import Machine, Record, ResultsFile, Software
from stepbench.setup import Setup
store, name = ResultsFile(sys.argv[1]), sys.argv[2]
setup = Setup(model="llama-tiny", mode="eager", attn="sdpa", batch=1, seq=64, device="cpu")
print("ready", flush=True)
sys.stdin.readline()
for i in range(200):
    store.append(Record(run_id=name, repeat=i, setup=setup, status="error",
                        error=name * 70_000, machine=Machine(gpu="cpu")))
"""


@pytest.mark.slow
def test_two_processes_appending_at_once_keep_every_line_whole(tmp_path):
    out = tmp_path / "r.jsonl"
    children = [subprocess.Popen([sys.executable, "-c", APPEND_MANY, str(out), name], env=ENV,
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
                for name in ("a", "b")]
    for child in children:                    # both started, then both go at once
        assert child.stdout.readline() == "ready\n"
    for child in children:
        child.stdin.write("go\n")
        child.stdin.close()
    for child in children:
        assert child.wait(timeout=120) == 0
    lines = out.read_text().splitlines()
    assert len(lines) == 400
    records = [json.loads(line) for line in lines]
    for name in ("a", "b"):
        mine = [r for r in records if r["run_id"] == name]
        assert [r["repeat"] for r in mine] == list(range(200))
        assert all(r["error"] == name * 70_000 for r in mine)


# Prints a line, then appends one record or reads the file; prints what it read.
WAIT_FOR_LOCK = """
import sys
from stepbench.record import Machine, Record, ResultsFile, Software
from stepbench.setup import Setup
store = ResultsFile(sys.argv[1])
print("starting", flush=True)
if sys.argv[2] == "append":
    setup = Setup(model="llama-tiny", mode="eager", attn="sdpa", batch=5, seq=64, device="cpu")
    store.append(Record(run_id="r1", repeat=0, setup=setup, status="ok",
                        machine=Machine(gpu="cpu")))
print(len(store.read()), flush=True)
"""


def blocked_on_a_lock(pid: int) -> bool:
    """Whether `pid` waits for a file lock (a "->" line of /proc/locks)."""
    return any("->" in line and str(pid) in line.split()
               for line in Path("/proc/locks").read_text().splitlines())


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/locks").exists(), reason="needs Linux's /proc/locks")
@pytest.mark.parametrize("action", ["append", "read"])
def test_an_append_or_a_read_waits_while_another_process_appends(tmp_path, action):
    out = tmp_path / "r.jsonl"
    out.write_bytes(line_of(a_record(1)))
    with open(out, "ab") as appending:        # as another stepbench's append holds it
        fcntl.flock(appending, fcntl.LOCK_EX)
        child = subprocess.Popen([sys.executable, "-c", WAIT_FOR_LOCK, str(out), action],
                                 env=ENV, stdout=subprocess.PIPE, text=True)
        try:
            assert child.stdout.readline() == "starting\n"
            # The child is about to take the lock; it must wait for it, not finish.
            while not blocked_on_a_lock(child.pid):
                assert child.poll() is None, f"{action} did not wait for the lock"
                os.sched_yield()
            appending.write(line_of(a_record(2)))   # the other append, finished while it waits
        except BaseException:
            child.kill()
            raise
    assert child.stdout.read() == ("3\n" if action == "append" else "2\n")
    assert child.wait(timeout=60) == 0
    assert [r.setup.batch for r in ResultsFile(out).read()] == \
        ([1, 2, 5] if action == "append" else [1, 2])


# ---------------------------------------------------------------- the run that cannot keep a record

# `stepbench run` (the real CLI) with two slots whose setups are fake: batch 2 runs long, the
# others report at once. The file size limit (argv[1]) ends inside the first new record.
RUN_PAST_LIMIT = """
import resource, sys
from stepbench.cli import main
from stepbench.execute.local import process as executor

JOB = '''
import json, os, sys, time
from stepbench import protocol
job = json.loads(sys.argv[1])
with open(sys.argv[2], "a") as log:
    log.write(json.dumps([job["setup"]["batch"], os.getpid()]) + "\\\\n")
print(protocol.encode("start", machine={"gpu": "cpu", "hostname": "fake"}, software={}), end="",
      flush=True)
if job["setup"]["batch"] == 2:
    time.sleep(120)     # still running when the other slot's record cannot be written
print(protocol.encode("result", status="ok", error=None, measured={"phase": "done",
                      "step_ms": 1.0}), end="", flush=True)
'''


class TwoFakeSlots(executor.LocalProcess):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.slots = ["0", "1"]

    def command(self, job):
        return [sys.executable, "-c", JOB, job.payload(), LOG]


LOG = sys.argv[2]
executor.LocalProcess = TwoFakeSlots
resource.setrlimit(resource.RLIMIT_FSIZE, (int(sys.argv[1]), int(sys.argv[1])))
sys.exit(main(sys.argv[3:]))
"""


@pytest.mark.slow
def test_a_run_whose_results_file_cannot_take_a_record_stops_with_one_line(tmp_path):
    out, log = tmp_path / "r.jsonl", tmp_path / "log.jsonl"
    ResultsFile(out).append(a_record(8))      # a setup of an earlier run, not in this plan
    before = out.read_bytes()
    # Two slots: batch 4 starts (longest first) beside batch 2; batch 1 waits for a slot.
    try:
        proc = python(RUN_PAST_LIMIT, len(before) + 200, log, "run", "--device", "cpu",
                      "--modes", "eager", "--attn", "sdpa", "--batch", "1,2,4", "--seq", "64",
                      "--repeats", "1", "--start", "fresh", "--out", out, timeout_s=60)
    except subprocess.TimeoutExpired:
        pytest.fail("the run went on after its results file failed (batch 2 sleeps 120 s)")
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    last = proc.stderr.splitlines()[-1]
    assert error_line(last, "run") and names(last, str(out), "File too large", "ulimit -f",
                                             "--out", "resume")
    assert out.read_bytes() == before
    started = [json.loads(line) for line in log.read_text().splitlines()]
    assert 4 in [batch for batch, _ in started] and 1 not in [batch for batch, _ in started]
    for batch, pid in started:                # the long setup was stopped with the run
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def test_a_record_says_its_format_by_name_and_old_files_read_back_unchanged(tmp_path):
    # The record formats are named (record.FORMATS), oldest first; a record's compile counters
    # show which one wrote it, and one in FORMAT_V1 is written back byte for byte.
    from stepbench.record import FORMAT_V1, FORMATS, LAYER_GRAPHS

    assert list(FORMATS) == sorted(FORMATS) and FORMATS[0] == FORMAT_V1
    layer = Setup(model="llama-tiny", mode="compile", attn="sdpa", batch=2, seq=64,
                  device="cpu", compile_scope="layer")
    old = Record(run_id="r", repeat=0, setup=layer, status="ok", step_ms=10.0,
                 tokens_per_s=1e4, compile={"graph_breaks": 0, "recompiles": 8})
    new = dataclasses.replace(old, compile={**old.compile, "recompile_limit_hits": 0})
    assert (old.format, new.format) == (FORMAT_V1, LAYER_GRAPHS)
    assert old.compiled_too_few_layers and not new.compiled_too_few_layers
    eager = dataclasses.replace(old, setup=layer.replace(mode="eager"), compile=None)
    assert eager.format == FORMAT_V1 and not eager.compiled_too_few_layers
    path = tmp_path / "old.jsonl"
    text = json.dumps(old.to_dict()) + "\n"
    path.write_text(text)
    [back] = ResultsFile(path).read()
    assert back.format == FORMAT_V1 and json.dumps(back.to_dict()) + "\n" == text
    # A transformers model's record holds no `blocks`; a factory's (issue 35) reads back.
    assert "blocks" not in old.to_dict()
    factory = dataclasses.replace(eager, blocks={"count": 3, "class": "Block"})
    path.write_text(json.dumps(factory.to_dict()) + "\n")
    assert [r.blocks for r in ResultsFile(path).read()] == [{"count": 3, "class": "Block"}]


# ---------------------------------------------------------------- values of the wrong type (issue 37)

def _wrong(value):
    """A JSON value of another type than `value`'s (a string where a number belongs, a number
    where a string, list or object does)."""
    if isinstance(value, bool):
        return "yes"
    if isinstance(value, (int, float)):
        return "big"
    if isinstance(value, str):
        return 12
    return "x"


def _schema_fields() -> list[tuple[str, object]]:
    """Every field a record's JSON holds, as (dotted path, a value of its type), from a full
    record (every field of Record, Setup, Machine and Software given a value)."""
    import dataclasses
    import typing

    from stepbench.axes import AXES

    def typical(kind):
        options = [k for k in typing.get_args(kind) if k is not type(None)] or [kind]
        kind = options[0]
        if typing.get_origin(kind) is list:
            return [typical(typing.get_args(kind)[0])]
        return {int: 3, float: 1.5, str: "text", bool: True}.get(kind, {})

    out = [(f.name, typical(typing.get_type_hints(Record)[f.name]))
           for f in dataclasses.fields(Record) if f.name not in ("setup", "machine", "software")]
    out += [(f"setup.{a.name}", typical(a.kind)) for a in AXES]
    for name, cls in (("machine", Machine), ("software", Software)):
        out += [(f"{name}.{f}", typical(k)) for f, k in typing.get_type_hints(cls).items()]
    return out


@pytest.mark.parametrize("field, value", _schema_fields())
def test_a_field_of_the_wrong_type_is_a_skipped_line_naming_file_and_line(tmp_path, capsys,
                                                                          field, value):
    """Each field of the schema (docs/results-schema.md) given a value of another type: the
    report skips that line with one warning naming the file, the line and the field, and
    reports the rest; never a traceback."""
    from stepbench.cli import main

    good = a_record().to_dict()
    bad = json.loads(json.dumps(good))
    where, _, name = field.rpartition(".")
    (bad[where] if where else bad)[name] = _wrong(value)
    path = tmp_path / "r.jsonl"
    path.write_text(json.dumps(good) + "\n" + json.dumps(bad) + "\n")
    code = main(["report", str(path), "--format", "json"])
    err = capsys.readouterr().err
    assert code == 0, err
    [warning] = [line for line in err.splitlines() if f"{path}:2" in line]
    assert "skipped" in warning and (name in warning or field in ("schema", "setup.model")
                                     or "not a stepbench record" in warning), warning
    assert "Traceback" not in err


@pytest.mark.parametrize("field, value, why", [
    ("step_ms", float("nan"), "step_ms is nan, not a number > 0 or null"),
    ("step_ms", -3.0, "step_ms is -3.0, not a number > 0 or null"),
    # tokens per second divide by it
    ("step_ms", 0, "step_ms is 0, not a number > 0 or null"),
    # finite, but no measurement: it would overflow the report's arithmetic
    ("first_step_s", 1e308, "first_step_s is 1e+308, larger than any measurement"),
    ("step_times_ms", [10.0, 1e300], "step_times_ms is [10.0, 1e+300], not a list of numbers"),
    # an integer past int64: matplotlib's plots cannot take it
    ("step_ms", 10**30, "step_ms is 1000000000000000000000000000000, larger than any measurement"),
    ("first_step_s", float("inf"), "first_step_s is inf"),
    ("step_times_ms", [10.0, -1.0], "step_times_ms is [10.0, -1.0], not a list of numbers >= 0"),
    ("peak_memory_gb", -0.5, "peak_memory_gb is -0.5"),
    ("setup.batch", 0, "setup.batch is 0, not an integer >= 1"),
    # no process ends so, and no process is numbered so (hostqa: both were read as records)
    ("status", "weird", 'status is "weird", not one of ok, oom'),
    ("repeat", -1, "repeat is -1, not an integer >= 0"),
    # tune reads blocks.count (issue 35): an object of another shape is no record either
    ("blocks", {"count": "12"}, 'blocks is {"count": "12"}, not an object {"count": an integer'),
    ("blocks", {"count": -1}, 'blocks is {"count": -1}, not an object'),
    ("blocks", {"class": "Block"}, 'blocks is {"class": "Block"}, not an object'),
    ("blocks", {"count": 2, "class": 7}, "blocks is"),
    # The objects a report, predict and tune read into: a value inside that does not fit is
    # named by its path.
    ("compile", {"graphs": 1, "graph_breaks": "x"}, 'compile.graph_breaks is "x", not an integer'),
    ("compile", {"break_reasons": 3}, "compile.break_reasons is 3, not a list of strings"),
    ("energy", {"joules_per_step": "x"}, "energy.joules_per_step is"),
    ("profile", {"classes_ms": {"matmul": "x"}}, "profile.classes_ms.matmul is"),
    ("profile", {"classes_ms": "x"}, "profile.classes_ms is"),
    ("profile", {"busy_s": -1.0}, "profile.busy_s is -1.0, not a number >= 0"),
    ("search", {"kind": ["max_batch"]}, "search.kind is"),
    ("search", {"stage": float("nan")}, "search.stage is nan, not a string"),
    ("search", {"probes": [[4, "ok"]]}, "search.probes[0] is"),
    ("ranks", [{"rank": 0, "step_times_ms": ["x"]}], "ranks[0].step_times_ms is"),
    ("ranks", [{"rank": 0, "step_times_ms": [1.0, -2.0]}],
     "ranks[0].step_times_ms is [1.0, -2.0], not a list of numbers >= 0"),
    ("telemetry", {"start": {"power_w": "x"}}, "telemetry.start.power_w is"),
    ("scaling", {"baseline": {"step_ms": []}}, "scaling.baseline.step_ms is"),
])
def test_an_impossible_value_is_a_skipped_line(tmp_path, capsys, field, value, why):
    from stepbench.cli import main

    good = a_record().to_dict()
    bad = json.loads(json.dumps(good))
    where, _, name = field.rpartition(".")
    (bad[where] if where else bad)[name] = value
    path = tmp_path / "r.jsonl"
    path.write_text(json.dumps(good) + "\n" + json.dumps(bad) + "\n")
    assert main(["report", str(path), "--format", "json"]) == 0
    err = capsys.readouterr().err
    assert f"{path}:2: skipped a record ({why}" in err, err


# ---------------------------------------------------------------- two runs on one file (issue 37)
# (the claims that keep them from measuring a setup twice: test_claims.py)

def test_a_duplicate_measured_at_the_same_time_is_a_warning_not_a_silent_drop(tmp_path):
    """Two runs that measured one setup at once (before claims): the report keeps the later
    record and says so, naming both lines; a rerun (started after) replaces without a word."""
    first, second, rerun = a_record(run_id="a"), a_record(run_id="b"), a_record(run_id="c")
    first.started_at, first.finished_at = "2026-12-04T01:00:00Z", "2026-12-04T01:00:30Z"
    second.started_at, second.finished_at = "2026-12-04T01:00:05Z", "2026-12-04T01:00:35Z"
    rerun.started_at, rerun.finished_at = "2026-12-04T02:00:00Z", "2026-12-04T02:00:30Z"
    path = tmp_path / "r.jsonl"
    path.write_bytes(line_of(first) + line_of(second) + line_of(rerun))
    warned = []
    [kept] = ResultsFile(path).latest(warned.append)
    assert kept.run_id == "c"
    # the later line, its setup and machine, the line it overlapped
    [warning] = warned
    assert warning.startswith(f"{path}:2: ")
    assert names(warning, "eager+sdpa (batch 1 x 64, repeat 0)", "on cpu", "line 1")
    # The golden of the duplicate-record warning, word for word.
    assert warning == (f"{path}:2: a second record of eager+sdpa (batch 1 x 64, repeat 0) on cpu, "
                       "measured while line 1's was (two runs at once on one file); the later "
                       "one counts")


def test_latest_and_resume_match_records_by_one_identity(tmp_path):
    """latest() keeps the last record per resume_parts; resume_key is the same parts as text,
    the text of files written before hosts (no host: three items)."""
    from stepbench.record import resume_key

    plain, on_host, other_gpu = a_record(run_id="a"), a_record(run_id="b"), a_record(run_id="c")
    on_host.host = "gpu-box"
    other_gpu.machine = dataclasses.replace(other_gpu.machine, gpu="NVIDIA H200")
    again = a_record(run_id="d")
    assert plain.resume_parts() == again.resume_parts() != on_host.resume_parts()
    assert json.loads(plain.resume_key()) == [plain.setup.key(), 0, "cpu"]
    assert json.loads(on_host.resume_key())[-1] == "gpu-box"
    assert on_host.resume_key() == json.dumps(list(on_host.resume_parts())) == resume_key(
        on_host.setup, 0, "cpu", "gpu-box")
    path = tmp_path / "r.jsonl"
    path.write_bytes(b"".join(line_of(r) for r in (plain, on_host, other_gpu, again)))
    kept = ResultsFile(path).latest(lambda message: None)
    assert [r.run_id for r in kept] == ["d", "b", "c"]
    assert len({r.resume_key() for r in kept}) == 3


# ---------------------------------------------------------------- the tool's own records

def test_every_committed_record_passes_the_checks_that_guard_the_readers():
    """Each record stepbench wrote on a real machine (benchmarks/results/) reads back whole: a
    check that refuses what the tool itself measures hides real rows from report and predict.
    The H200's host-bound eager+sdpa measured its host lead at -0.03 ms (two clocks, zero within
    their offset), and `host_lead_ms >= 0` skipped both of its records."""
    results = Path(__file__).resolve().parent.parent / "benchmarks" / "results"
    skipped, read = [], 0
    for path in sorted(results.rglob("*.jsonl")):
        head = path.read_text().split("\n", 1)[0]
        if '"schema"' not in head:
            continue          # another program's lines (the post's script, torchtitan's logs)
        read += len(ResultsFile(path).read(skipped.append))
    assert read > 500
    assert skipped == []
    leads = [r.host_lead_ms for r in ResultsFile(
        results / "h200-2026-12-05-default-run-profile.jsonl").read() if r.setup.attn == "sdpa"
        and r.setup.mode == "eager"]
    assert len(leads) == 2 and min(leads) < 0


@pytest.mark.parametrize("text, refused", [
    ("hello world\nthis is prose\n", True),
    ("a,b,c\n1,2,3\n", True),
    ('[{"setup": {}}]\n', True),
    ('{"a": 1}\n', True),
    ("", False),
    # hostqa: blank lines were refused though an empty file is taken (the reader skips them)
    ("\n\n  \n", False),
])
def test_out_takes_a_results_file_or_an_empty_one_only(tmp_path, text, refused):
    from stepbench.record_checks import out_problem

    path = tmp_path / "out.jsonl"
    path.write_text(text)
    problem = out_problem(path)
    assert (problem is not None) == refused, problem
    assert not refused or names(problem, str(path), "not a stepbench results file")
