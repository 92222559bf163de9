"""Bad input to `stepbench run`: one line on stderr that names the fix, exit code 2, no traceback."""

import os
import shutil
from pathlib import Path

import pytest

from stepbench.cli import main
from stepbench.errors import UserError
from stepbench.measure.models import build_config
from conftest import run_cli
from says import lines_naming, missing, names, user_error


@pytest.fixture
def config_file(tmp_path):
    def make(text: str, name: str = "config.json"):
        path = tmp_path / name
        path.write_text(text)
        return path
    return make


# (flags, the error's kind, what its line must name). The wording itself is pinned once per
# kind, in GOLDEN below.
CASES = [
    (["--model", "llama-9000"], None, ("'llama-9000'", "llama-tiny", "llama-135m")),
    (["--attn", "sdp"], "unknown_value", ("'sdp'", "eager, sdpa, flex_attention")),
    (["--modes", "eager,jit"], "unknown_value", ("'jit'", "eager, compile")),
    (["--compile-mode", "fast"], "unknown_value", ("'fast'", "default")),
    (["--dtype", "int8"], "unknown_value", ("'int8'", "bf16", "autocast-bf16", "float8")),
    (["--precision", "bf8"], "unknown_value", ("'bf8'", "bf16", "autocast-bf16")),
    (["--kernels", "triton"], "unknown_value", ("'triton'", "none", "liger", "liger-no-flce")),
    (["--optimizer", "adam"], "unknown_value", ("'adam'", "fused", "foreach")),
    (["--compile-scope", "block"], "unknown_value", ("'block'", "model", "layer")),
    (["--checkpointing", "maybe"], "bad_value", ("--checkpointing", "'maybe'", "off", "on")),
    # Can never run: refused before any process starts.
    (["--modes", "eager", "--compile-scope", "layer"], "conflict",
     ("--compile-scope layer", "torch.compile")),
    (["--batch", "0"], "bad_value", ("--batch", ">= 1", "0")),
    (["--batch", "4,-2"], "bad_value", ("--batch", ">= 1", "-2")),
    (["--batch", "four"], "bad_value", ("--batch", "integers", "'four'")),
    (["--seq", "0"], "bad_value", ("--seq", ">= 1", "0")),
    (["--attn", "sdpa,,eager"], "bad_list", ("--attn",)),
    (["--steps", "0"], "bad_value", ("--steps", ">= 1", "0")),
    (["--timeout", "0"], "bad_value", ("--timeout", "> 0", "0")),
    (["--repeats", "0"], "bad_value", ("--repeats", ">= 1", "0")),
    (["--memory-limit-gb", "-1"], "bad_value", ("--memory-limit-gb", "> 0", "-1")),
    # Numbers torch cannot take, or that never end: refused, not a setup error in each process.
    (["--seed", str(2**64)], "bad_value", ("--seed", str(2**63 - 1), str(2**64))),
    (["--steps", "1" + "0" * 20], "bad_value", ("--steps", str(2**63 - 1))),
    (["--timeout", "inf"], "bad_value", ("--timeout", "finite", "inf")),
    (["--memory-limit-gb", "inf"], "bad_value", ("--memory-limit-gb", "finite", "inf")),
    (["--device", "cuda"], None, ("--device cuda", "CUDA", "--device cpu")),
    (["--model", "/nonexistent/config.json"], None, ("/nonexistent/config.json", "config.json")),
    (["--out", "/proc/stepbench/results.jsonl"], None, ("/proc/stepbench/results.jsonl",)),
    # FSDP2's wrapping choices need FSDP2 setups (docs/gpus.md).
    (["--fsdp-reshard", "off"], "conflict", ("--fsdp-reshard", "--parallel fsdp2")),
    (["--parallel", "ddp", "--nproc", "2", "--fsdp-prefetch", "on"], "conflict",
     ("--fsdp-prefetch", "--parallel fsdp2")),
    (["--fsdp-prefetch", "sometimes"], "bad_value", ("--fsdp-prefetch", "'sometimes'")),
    (["--precision", "mixed-bf16"], "conflict", ("--precision mixed-bf16", "--parallel fsdp2")),
    (["--precision", "bf16,mixed-bf16", "--parallel", "none,fsdp2"], "conflict",
     ("--precision mixed-bf16", "--parallel fsdp2")),
    (["--profile", "/etc/hostname"], None, ("--profile /etc/hostname", "folder")),
    (["--profile", "traces", "--host", "gpu-a"], "conflict", ("--profile",)),
    # A cluster (docs/ray.md, docs/slurm.md), refused before any cluster is asked.
    (["--gpu-type", "H100"], "conflict", ("--gpu-type", "--ray", "--slurm")),
    (["--parallel", "ddp", "--nnodes", "2", "--node-rank", "0", "--rdzv-endpoint", "h:99999"],
     "bad_value", ("--rdzv-endpoint", "'h:99999'", "HOST:PORT")),
    # The settings of SSH hosts and rentals, without any: they would be ignored.
    (["--remote-python", "python3.12"], "conflict", ("--remote-python", "--host", "--rent")),
    (["--ssh-config", "/etc/hostname"], "conflict", ("--ssh-config", "--host", "--rent")),
    (["--rent-max-minutes", "30"], "conflict", ("--rent-max-minutes", "--rent")),
    (["--host", "gpu-a", "--rent-key", "/etc/hostname"], "conflict", ("--rent-key", "--rent")),
    (["--ray", "http://head:8265", "--host", "gpu-a"], "conflict",
     ("--ray", "--host", "--hosts-file", "--rent")),
    (["--ray", "http://head:8265", "--node-rank", "0"], "conflict",
     ("--ray", "--node-rank", "--rdzv-endpoint")),
    (["--slurm", "--rent", "runcrate:L40S"], "conflict",
     ("--slurm", "--host", "--hosts-file", "--rent")),
    (["--slurm", "gpu", "--ray", "auto"], "conflict", ("--ray", "--slurm")),
    (["--slurm", "gpu,cpu"], "bad_value", ("--slurm", "'gpu,cpu'")),
    (["--slurm", "--nnodes", "2", "--parallel", "ddp", "--rdzv-endpoint", "a:1"], "conflict",
     ("--slurm", "--node-rank", "--rdzv-endpoint")),
    # On a CPU, a step that cannot fit the machine's memory is refused before its process grows
    # until the kernel kills it: the floor of its memory, by part (measure/footprint.py).
    (["--modes", "eager", "--attn", "eager", "--seq", "100000"], None,
     ("eager+eager", "100000", "1301 GB", "16 GB", "1280 GB")),
]

# One exact line per kind of error (and the memory floor's): the wording as users read it.
GOLDEN = [
    (["--attn", "sdp"], "unknown attention 'sdp'; choose one of: eager, sdpa, flex_attention"),
    (["--batch", "0"], "--batch must be an integer >= 1, got 0"),
    (["--attn", "sdpa,,eager"], "--attn needs a comma-separated list without empty items"),
    (["--ray", "http://head:8265", "--host", "gpu-a"],
     "--ray runs the setups on a Ray cluster; drop --host, --hosts-file and --rent (or --ray)"),
    (["--modes", "eager", "--attn", "eager", "--seq", "100000"],
     "eager+eager at batch 4 x seq 100000 needs at least 1301 GB of memory (logits 16 GB, "
     "attention scores 1280 GB), and this machine has "),
]


ARGPARSE_CASES = [
    (["run", "--init", "gpu"], "stepbench run: error: argument --init: invalid choice: 'gpu' "
                               "(choose from 'device', 'cpu'); see stepbench run --help"),
    (["run", "--steps", "many"], "argument --steps: invalid int value: 'many'"),
    (["run", "--no-such-flag"], "unrecognized arguments: --no-such-flag"),
    (["jog"], "stepbench: error: argument COMMAND: invalid choice: 'jog'"),
    (["report", "--format", "pdf"], "argument --format: invalid choice: 'pdf'"),
]


@pytest.mark.parametrize("args, message", ARGPARSE_CASES, ids=[" ".join(a) for a, _ in ARGPARSE_CASES])
def test_argparse_errors_are_one_line_too(args, message, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(args)
    err = capsys.readouterr().err
    assert exit_.value.code == 2
    assert message in err and "usage:" not in err
    assert len(err.strip().splitlines()) == 1, err


def _run_args(args, tmp_path) -> list[str]:
    """`stepbench run ARGS` on the CPU, into the test's own results file unless ARGS name one."""
    if "--device" not in args:
        args = args + ["--device", "cpu"]
    if "--out" not in args:
        args = args + ["--out", str(tmp_path / "r.jsonl")]
    return ["run", *args]


def _run_bad(args, tmp_path, capsys) -> tuple[int, str]:
    code = main(_run_args(args, tmp_path))
    return code, capsys.readouterr().err


@pytest.mark.parametrize("args, kind, tokens", CASES, ids=[" ".join(a) for a, _, _ in CASES])
def test_bad_input_is_one_line_and_exit_2(args, kind, tokens, capsys, tmp_path):
    code, err = _run_bad(args, tmp_path, capsys)
    assert code == 2
    assert not missing(err, *tokens), err
    assert "Traceback" not in err
    assert len(err.strip().splitlines()) == 1, err
    # Nothing ran, so nothing was written.
    out = tmp_path / "r.jsonl"
    assert not out.exists() or out.read_text() == ""
    assert user_error(_run_args(args, tmp_path)).kind == kind


@pytest.mark.parametrize("args, message", GOLDEN, ids=[" ".join(a) for a, _ in GOLDEN])
def test_golden_wording_of_each_kind_of_error(args, message, capsys, tmp_path):
    code, err = _run_bad(args, tmp_path, capsys)
    assert code == 2 and err.startswith(f"stepbench run: error: {message}"), err


def test_seq_above_the_configs_positions(config_file, capsys, tmp_path):
    cfg = config_file('{"model_type": "llama", "hidden_size": 32, "intermediate_size": 64, '
                      '"num_hidden_layers": 1, "num_attention_heads": 2, "vocab_size": 100, '
                      '"max_position_embeddings": 128}')
    code = main(["run", "--device", "cpu", "--model", str(cfg), "--seq", "256",
                 "--out", str(tmp_path / "r.jsonl")])
    err = capsys.readouterr().err
    assert code == 2
    assert names(err, "--seq 256", "max_position_embeddings", "128"), err


@pytest.mark.parametrize("text, tokens", [
    ("{not json", ("JSON",)),
    ('{"hidden_size": 32}', ("'model_type'",)),
    ('{"model_type": "no-such-arch"}', ("model_type 'no-such-arch'",)),
    # Configs transformers takes but no model can be built from (issue 37).
    ('{"model_type": "llama", "hidden_size": "big", "num_attention_heads": 4}',
     ("hidden_size", '"big"')),
    ('{"model_type": "llama", "hidden_size": 66, "num_attention_heads": 4}',
     ("hidden_size 66", "num_attention_heads 4", "64")),
    ('{"model_type": "llama", "hidden_size": 64, "num_attention_heads": 4, '
     '"num_key_value_heads": 3}', ("num_attention_heads 4", "num_key_value_heads 3")),
    ('{"model_type": "llama", "num_hidden_layers": -2}', ("num_hidden_layers", "-2")),
    ('{"model_type": "llama", "rms_norm_eps": "tiny"}', ("rms_norm_eps", '"tiny"')),
    # Each of these was a traceback (exit 1), or a pass and then an error in every setup's
    # process, or a silent 7B-sized layer (hostqa).
    ('{"model_type": "llama", "rms_norm_eps": -1}', ("rms_norm_eps", "-1", "above 0")),
    ('{"model_type": "llama", "attention_dropout": 2.0}', ("attention_dropout", "2.0")),
    ('{"model_type": "llama", "rope_scaling": "linear"}', ("rope_scaling", '"linear"')),
    ('{"model_type": "llama", "rope_scaling": [1, 2]}', ("rope_scaling", "[1, 2]")),
    ('{"model_type": "llama", "rope_scaling": {"rope_type": "linear"}}',
     ("transformers rejects", "factor")),
    ('{"model_type": "llama", "rope_scaling": {"rope_type": "dynamic", "factor": -2}}',
     ("rope_scaling's factor", "-2")),
    ('{"model_type": "llama", "rope_scaling": {"rope_type": "bogus", "factor": 2.0}}',
     ("'bogus'", "linear")),
    ('{"model_type": "llama", "hidden_size": 64, "num_attention_heads": 4}',
     ("intermediate_size 11008", "llama")),
    ('[{"model_type": "llama"}]', ("JSON list", "object")),
    ("", ("empty",)),
])
def test_malformed_config(config_file, capsys, tmp_path, text, tokens):
    cfg = config_file(text)
    code = main(["run", "--device", "cpu", "--model", str(cfg), "--out", str(tmp_path / "r.jsonl")])
    err = capsys.readouterr().err
    assert code == 2 and names(err, str(cfg), *tokens) and "Traceback" not in err, err
    assert len(err.strip().splitlines()) == 1 and not (tmp_path / "r.jsonl").exists()


def test_folder_without_config(capsys, tmp_path):
    code = main(["run", "--device", "cpu", "--model", str(tmp_path), "--out", str(tmp_path / "r.jsonl")])
    assert code == 2
    assert names(capsys.readouterr().err, str(tmp_path), "config.json")


# transformers' own error for an unknown model_type lists every type it knows: 12,000 characters
# on one line, with the typo somewhere at its start.

def test_unknown_model_type_is_short_and_suggests_close_types(config_file):
    cfg = config_file('{"model_type": "lama", "hidden_size": 32}')
    with pytest.raises(UserError) as caught:
        build_config(str(cfg), 64)
    message = str(caught.value)
    assert "model_type 'lama'" in message
    assert "did you mean 'llama'" in message
    assert "print(sorted(transformers.CONFIG_MAPPING))" in message     # where the full list is
    assert "\n" not in message and len(message) < 300, message


def test_unknown_model_type_without_close_types_says_so(config_file):
    cfg = config_file('{"model_type": "no-such-arch"}')
    with pytest.raises(UserError) as caught:
        build_config(str(cfg), 64)
    message = str(caught.value)
    assert "did you mean" not in message
    assert names(message, "'no-such-arch'", "transformers") and len(message) < 300, message


@pytest.mark.slow
def test_unknown_model_type_from_the_command_line(config_file, tmp_path):
    cfg = config_file('{"model_type": "lama"}', name="BAD.json")
    proc = run_cli("run", "--device", "cpu", "--model", cfg, "--out", tmp_path / "r.jsonl",
                   timeout=300)
    assert proc.returncode == 2
    assert names(proc.stderr, "'lama'", "'llama'")      # its golden: above
    assert "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) <= 3, proc.stderr
    assert len(proc.stderr) < 600, proc.stderr
    assert not (tmp_path / "r.jsonl").exists() or (tmp_path / "r.jsonl").read_text() == ""


@pytest.mark.parametrize("args, tokens", [
    (["--ray", "auto"], ("--ray auto", "RAY_ADDRESS")),
    (["--ray", "http://head:8265", "--model", "/data/config.json"],
     ("--model /data/config.json", "--ray", "preset")),
])
def test_ray_input_is_refused_before_the_cluster_is_asked(args, tokens, capsys, tmp_path, monkeypatch):
    pytest.importorskip("ray.job_submission", reason="Ray's Jobs API is not installed")
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    code = main(["run", *args, "--out", str(tmp_path / "r.jsonl")])
    err = capsys.readouterr().err
    assert code == 2 and names(err, *tokens) and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "r.jsonl").exists()


DATA = Path(__file__).parent / "data"
# Every flag that names a path, given one it cannot use: (command and flags, what its line must
# name: the path and, where the OS said it, why). "{tmp}" is the test's folder, holding a file
# "file" and a results file "r.jsonl".
PATH_CASES = [
    (["run", "--plan", "{tmp}/missing.toml"], ("plan", "{tmp}/missing.toml", "No such file")),
    (["run", "--plan", "{tmp}"], ("plan", "{tmp} ", "Is a directory")),
    (["run", "--out", "{tmp}"], ("{tmp} ", "folder", "--out")),
    # A dry run refuses the --out that the run would (it reads and makes nothing).
    (["run", "--out", "{tmp}", "--dry-run"], ("{tmp} ", "folder", "--out")),
    (["run", "--out", "{tmp}/file/r.jsonl", "--dry-run"], ("{tmp}/file/r.jsonl", "{tmp}/file ")),
    (["run", "--out", "{tmp}/file/r.jsonl"], ("results", "{tmp}/file/r.jsonl")),
    (["run", "--compile-cache", "{tmp}/file"], ("--compile-cache {tmp}/file", "folder")),
    (["run", "--compile-cache", "{tmp}/file/cache"],
     ("--compile-cache {tmp}/file/cache", "{tmp}/file is a file")),
    (["run", "--compile-cache", "/proc/nope"], ("--compile-cache /proc/nope ",)),
    (["run", "--compile-cache", "{tmp}/file", "--dry-run"], ("--compile-cache {tmp}/file",)),
    (["run", "--model", "{tmp}/missing.json"], ("'{tmp}/missing.json'",)),
    (["run", "--hosts-file", "{tmp}/missing"], ("hosts file {tmp}/missing",)),
    (["run", "--host", "a", "--ssh-config", "{tmp}/missing"], ("SSH config {tmp}/missing",)),
    (["tune", "--budget", "1m", "--compile-cache", "{tmp}/file"], ("--compile-cache {tmp}/file",)),
    (["tune", "--budget", "1m", "--compile-cache", "/proc/nope"], ("--compile-cache /proc/nope ",)),
    (["tune", "--budget", "1m", "--out", "{tmp}"], ("{tmp} ", "folder", "--out")),
    # A file that holds something else: JSON appended to it would spoil both (issue 37).
    (["run", "--out", "{tmp}/file"], ("{tmp}/file", "results file")),
    (["tune", "--budget", "1m", "--out", "{tmp}/file"], ("{tmp}/file", "results file")),
    (["run", "--out", "{tmp}/file", "--dry-run"], ("{tmp}/file", "results file")),
    # A report, comparison or price file never writes over results (the file given to read,
    # or any other): that would lose them.
    (["report", "{tmp}/r.jsonl", "--out", "{tmp}/r.jsonl"], ("{tmp}/r.jsonl", "results", "--out")),
    (["compare", "{tmp}/r.jsonl", "{tmp}/r2.jsonl", "--out", "{tmp}/r.jsonl"],
     ("{tmp}/r.jsonl", "results", "--out")),
    # ... refused as the flag is read: before plots are written, prices fetched, records read.
    (["report", "{tmp}/r.jsonl", "--plots", "{tmp}/plots", "--out", "{tmp}/r2.jsonl"],
     ("--out", "{tmp}/r2.jsonl", "results")),
    (["prices", "--out", "{tmp}/r.jsonl"], ("--out", "{tmp}/r.jsonl", "results")),
    # ... nor over the price list it reads.
    (["report", "{tmp}/r.jsonl", "--prices", "{tmp}/prices.toml", "--out", "{tmp}/prices.toml"],
     ("--out {tmp}/prices.toml", "--prices")),
    (["predict", "{tmp}/r.jsonl", "--gpu", "L40S", "--price-list", "{tmp}/prices.toml", "--out",
      "{tmp}/prices.toml"], ("--out {tmp}/prices.toml", "--price-list")),
    (["predict", "{tmp}/missing.jsonl", "--gpu", "L40S", "--out", "{tmp}/r.jsonl"],
     ("--out", "{tmp}/r.jsonl", "results")),
    (["report", "{tmp}/missing.jsonl"], ("results file", "'{tmp}/missing.jsonl'")),
    (["report", "{tmp}/r.jsonl", "--prices", "{tmp}/missing.toml"],
     ("price file", "'{tmp}/missing.toml'")),
    (["report", "{tmp}/r.jsonl", "--out", "{tmp}"], ("{tmp} ", "Is a directory")),
    (["report", "{tmp}/r.jsonl", "--plots", "{tmp}/file"], ("--plots {tmp}/file", "folder")),
    # A pipe would wait for a writer forever, a device never end; a read that fails part-way.
    (["run", "--plan", "{tmp}/pipe"], ("plan {tmp}/pipe", "pipe")),
    (["run", "--hosts-file", "{tmp}/pipe"], ("hosts file {tmp}/pipe", "pipe")),
    (["run", "--out", "{tmp}/pipe", "--dry-run"], ("{tmp}/pipe", "regular file", "--out")),
    (["report", "/proc/self/mem"], ("results file /proc/self/mem", "Input/output error")),
    (["report", "{tmp}/r.jsonl", "--plots", "{tmp}/file/plots"], ("plots", "{tmp}/file/plots")),
]


@pytest.mark.parametrize("args, tokens", PATH_CASES, ids=[" ".join(a) for a, _ in PATH_CASES])
def test_every_bad_path_flag_is_one_line_and_exit_2(args, tokens, capsys, tmp_path):
    (tmp_path / "file").write_text("not a folder\n")
    shutil.copy(DATA / "v0.1" / "cpu-results.jsonl", tmp_path / "r.jsonl")
    shutil.copy(DATA / "v0.1" / "cpu-results.jsonl", tmp_path / "r2.jsonl")
    os.mkfifo(tmp_path / "pipe")
    (tmp_path / "prices.toml").write_text('[prices]\n"NVIDIA H200" = 3.5\n')
    args = [a.replace("{tmp}", str(tmp_path)) for a in args]
    if args[0] not in ("report", "compare", "prices", "predict"):
        args += ["--device", "cpu"] + (["--out", str(tmp_path / "new.jsonl")]
                                       if "--out" not in args else [])
    try:
        code = main(args)
    except SystemExit as exc:           # refused as argparse reads the flag
        code = exc.code
    err = capsys.readouterr().err
    assert code == 2, err
    assert not missing(err, *(t.replace("{tmp}", str(tmp_path)) for t in tokens)), err
    # (The report warns about what it read before it fails to write: "no price for 'cpu'".)
    lines = [line for line in err.strip().splitlines() if "warning:" not in line]
    assert "Traceback" not in err and len(lines) == 1, err
    assert not (tmp_path / "new.jsonl").exists() and not (tmp_path / "plots").exists()
    assert (tmp_path / "file").read_text() == "not a folder\n"
    assert (tmp_path / "prices.toml").read_text() == '[prices]\n"NVIDIA H200" = 3.5\n'
    assert (tmp_path / "r.jsonl").read_bytes() == (DATA / "v0.1" / "cpu-results.jsonl").read_bytes()


def test_a_warning_is_one_line_alike_in_every_command(capsys, tmp_path):
    # A results file with a line that is no record: run (which reads it to resume; everything
    # is in it, so nothing runs), report and compare say so in the same words, without Python's
    # source line.
    out = tmp_path / "r.jsonl"
    shutil.copy(DATA / "v0.1" / "cpu-results.jsonl", out)
    with out.open("a") as f:
        f.write('{"garbage": 1}\n')
    where = f"{out}:{len(out.read_text().splitlines())}"
    assert main(["run", "--device", "cpu", "--modes", "eager", "--attn", "sdpa", "--seq", "64",
                 "--warmup", "1", "--steps", "3", "--repeats", "1", "--out", str(out)]) == 0
    ran = capsys.readouterr().err
    assert main(["report", str(out)]) == 0
    reported = capsys.readouterr().err
    after = tmp_path / "after.jsonl"
    shutil.copy(out, after)
    assert main(["compare", str(out), str(after)]) == 0
    compared = capsys.readouterr().err
    said = f"warning: {where}: skipped a line that is not a stepbench record"
    assert f"stepbench run: {said}\n" in ran and f"stepbench report: {said}\n" in reported
    assert f"stepbench compare: {said}\n" in compared
    assert "UserWarning" not in ran and "warn(" not in ran
    assert lines_naming(ran, "(ok)", "skipped")


def test_a_libraries_warning_names_its_source_on_the_same_line(capsys):
    import warnings

    from stepbench.errors import show_warnings

    show_warnings("tune")
    warnings.warn_explicit("TypedStorage is deprecated", UserWarning, "/x/torch/storage.py", 7)
    assert capsys.readouterr().err == ("stepbench tune: warning: TypedStorage is deprecated "
                                       "(UserWarning, torch/storage.py:7)\n")


def test_a_user_errors_kind_names_its_family_and_survives_a_plans_heading(tmp_path):
    assert UserError("x").kind is None and UserError("x", kind="conflict").kind == "conflict"
    with pytest.raises(ValueError, match="choose one of"):
        UserError("x", kind="no_such_kind")
    from stepbench.record import ResultsFileError
    assert ResultsFileError("x").kind == "results_file" and ResultsFileError("x").exit_code == 1
    plan = tmp_path / "p.toml"
    plan.write_text('device = "cpu"\n[axes]\nbatch = [0]\n')
    error = user_error(["run", "--plan", str(plan), "--out", str(tmp_path / "r.jsonl")])
    assert error.kind == "bad_value" and names(str(error), f"plan {plan}", "batch", "0")
