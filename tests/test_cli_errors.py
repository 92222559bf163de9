"""Bad input to `stepbench run`: one line on stderr that names the fix, exit code 2, no traceback."""

import shutil
from pathlib import Path

import pytest

from stepbench.cli import main
from stepbench.errors import UserError
from stepbench.measure.models import build_config
from conftest import run_cli


@pytest.fixture
def config_file(tmp_path):
    def make(text: str, name: str = "config.json"):
        path = tmp_path / name
        path.write_text(text)
        return path
    return make


CASES = [
    (["--model", "llama-9000"], "unknown model 'llama-9000': not a preset (llama-468m, llama-tiny, llama-135m, llama-small)"),
    (["--attn", "sdp"], "unknown attention 'sdp'; choose one of: eager, sdpa, flex_attention"),
    (["--modes", "eager,jit"], "unknown mode 'jit'; choose one of: eager, compile"),
    (["--compile-mode", "fast"], "unknown compile mode 'fast'; choose one of: default"),
    (["--dtype", "int8"], "unknown precision 'int8'; choose one of: bf16, fp16, fp32, autocast-bf16, float8"),
    (["--precision", "bf8"], "unknown precision 'bf8'; choose one of: bf16, fp16, fp32, autocast-bf16"),
    (["--kernels", "triton"], "unknown fused kernels 'triton'; choose one of: none, liger, liger-no-flce"),
    (["--optimizer", "adam"], "unknown optimizer 'adam'; choose one of: fused, foreach"),
    (["--compile-scope", "block"], "unknown compile scope 'block'; choose one of: model, layer"),
    (["--checkpointing", "maybe"], "--checkpointing takes a comma list of off and on, got 'maybe'"),
    # Can never run: refused before any process starts.
    (["--modes", "eager", "--compile-scope", "layer"],
     "--compile-scope layer needs torch.compile; eager mode compiles nothing"),
    (["--batch", "0"], "--batch must be an integer >= 1, got 0"),
    (["--batch", "4,-2"], "--batch must be an integer >= 1, got -2"),
    (["--batch", "four"], "--batch needs comma-separated integers, got 'four'"),
    (["--seq", "0"], "--seq must be an integer >= 1, got 0"),
    (["--attn", "sdpa,,eager"], "--attn needs a comma-separated list without empty items"),
    (["--steps", "0"], "--steps must be an integer >= 1, got 0"),
    (["--timeout", "0"], "--timeout must be > 0 seconds, got 0"),
    (["--repeats", "0"], "--repeats must be an integer >= 1, got 0"),
    (["--memory-limit-gb", "-1"], "--memory-limit-gb must be > 0, got -1"),
    (["--device", "cuda"], "--device cuda was asked for, but torch sees no CUDA GPU here; use --device cpu"),
    (["--model", "/nonexistent/config.json"], "no such file; pass a preset name or the path of an HF config.json"),
    (["--out", "/proc/stepbench/results.jsonl"], "cannot write results to /proc/stepbench/results.jsonl"),
    # FSDP2's wrapping choices need FSDP2 setups (docs/gpus.md).
    (["--fsdp-reshard", "off"], "--fsdp-reshard is a choice of FSDP2's wrapping: add --parallel fsdp2 or drop --fsdp-reshard"),
    (["--parallel", "ddp", "--nproc", "2", "--fsdp-prefetch", "on"], "--fsdp-prefetch is a choice of FSDP2's wrapping: add --parallel fsdp2 or drop --fsdp-prefetch"),
    (["--fsdp-prefetch", "sometimes"], "--fsdp-prefetch takes a comma list of off and on, got 'sometimes'"),
    (["--precision", "mixed-bf16"], "--precision mixed-bf16 is FSDP2's mixed precision: it needs --parallel fsdp2 alone"),
    (["--precision", "bf16,mixed-bf16", "--parallel", "none,fsdp2"], "--precision mixed-bf16 is FSDP2's mixed precision: it needs --parallel fsdp2 alone"),
    (["--profile", "/etc/hostname"], "--profile /etc/hostname is a file; pass --profile a folder you can write to"),
    (["--profile", "traces", "--host", "gpu-a"], "--profile writes its traces on this machine; drop it"),
    # A cluster (docs/ray.md, docs/slurm.md), refused before any cluster is asked.
    (["--gpu-type", "H100"], "--gpu-type chooses a GPU type of a cluster; add --ray ADDRESS or --slurm [PARTITION] (or drop --gpu-type)"),
    (["--ray", "http://head:8265", "--host", "gpu-a"], "--ray runs the setups on a Ray cluster; drop --host, --hosts-file and --rent (or --ray)"),
    (["--ray", "http://head:8265", "--node-rank", "0"], "--ray places a job's nodes itself; drop --node-rank and --rdzv-endpoint"),
    (["--slurm", "--rent", "runcrate:L40S"], "--slurm runs the setups on a Slurm cluster; drop --host, --hosts-file and --rent (or --slurm)"),
    (["--slurm", "gpu", "--ray", "auto"], "--ray and --slurm each name the cluster that runs the setups; pass one of them"),
    (["--slurm", "gpu,cpu"], "--slurm takes one partition's name (or none, for the default one), got 'gpu,cpu'"),
    (["--slurm", "--nnodes", "2", "--parallel", "ddp", "--rdzv-endpoint", "a:1"], "--slurm places a job's nodes itself; drop --node-rank and --rdzv-endpoint"),
    # On a CPU, a step that cannot fit the machine's memory is refused before its process grows
    # until the kernel kills it: the floor of its memory, by part (measure/footprint.py).
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


@pytest.mark.parametrize("args, message", CASES, ids=[" ".join(a) for a, _ in CASES])
def test_bad_input_is_one_line_and_exit_2(args, message, capsys, tmp_path):
    if "--device" not in args:
        args = args + ["--device", "cpu"]
    if "--out" not in args:
        args = args + ["--out", str(tmp_path / "r.jsonl")]
    code = main(["run", *args])
    err = capsys.readouterr().err
    assert code == 2
    assert message in err
    assert "Traceback" not in err
    assert len(err.strip().splitlines()) == 1, err
    # Nothing ran, so nothing was written.
    out = tmp_path / "r.jsonl"
    assert not out.exists() or out.read_text() == ""


def test_seq_above_the_configs_positions(config_file, capsys, tmp_path):
    cfg = config_file('{"model_type": "llama", "hidden_size": 32, "intermediate_size": 64, '
                      '"num_hidden_layers": 1, "num_attention_heads": 2, "vocab_size": 100, '
                      '"max_position_embeddings": 128}')
    code = main(["run", "--device", "cpu", "--model", str(cfg), "--seq", "256",
                 "--out", str(tmp_path / "r.jsonl")])
    err = capsys.readouterr().err
    assert code == 2
    assert "--seq 256 is above the model's max_position_embeddings (128); use --seq 128 or less" in err


@pytest.mark.parametrize("text, message", [
    ("{not json", "not a readable JSON config"),
    ('{"hidden_size": 32}', "no 'model_type' in the config; add it"),
    ('{"model_type": "no-such-arch"}', "transformers does not know model_type 'no-such-arch'"),
    # Configs transformers takes but no model can be built from (issue 37).
    ('{"model_type": "llama", "hidden_size": "big", "num_attention_heads": 4}',
     'hidden_size is "big", not a whole number above 0; fix the config'),
    ('{"model_type": "llama", "hidden_size": 66, "num_attention_heads": 4}',
     "hidden_size 66 is not a multiple of num_attention_heads 4; make it one (e.g. 64)"),
    ('{"model_type": "llama", "hidden_size": 64, "num_attention_heads": 4, '
     '"num_key_value_heads": 3}', "num_attention_heads 4 is not a multiple of num_key_value_heads 3"),
    ('{"model_type": "llama", "num_hidden_layers": -2}', "num_hidden_layers is -2, not a whole"),
    ('{"model_type": "llama", "rms_norm_eps": "tiny"}', 'rms_norm_eps is "tiny", not a number'),
])
def test_malformed_config(config_file, capsys, tmp_path, text, message):
    cfg = config_file(text)
    code = main(["run", "--device", "cpu", "--model", str(cfg), "--out", str(tmp_path / "r.jsonl")])
    err = capsys.readouterr().err
    assert code == 2 and message in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1 and not (tmp_path / "r.jsonl").exists()


def test_folder_without_config(capsys, tmp_path):
    code = main(["run", "--device", "cpu", "--model", str(tmp_path), "--out", str(tmp_path / "r.jsonl")])
    assert code == 2
    assert "folder has no config.json" in capsys.readouterr().err


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
    assert "fix the config or upgrade transformers" in message and len(message) < 300, message


@pytest.mark.slow
def test_unknown_model_type_from_the_command_line(config_file, tmp_path):
    cfg = config_file('{"model_type": "lama"}', name="BAD.json")
    proc = run_cli("run", "--device", "cpu", "--model", cfg, "--out", tmp_path / "r.jsonl",
                   timeout=300)
    assert proc.returncode == 2
    assert "did you mean 'llama'" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) <= 3, proc.stderr
    assert len(proc.stderr) < 600, proc.stderr
    assert not (tmp_path / "r.jsonl").exists() or (tmp_path / "r.jsonl").read_text() == ""


@pytest.mark.parametrize("args, message", [
    (["--ray", "auto"], "--ray auto reads RAY_ADDRESS, which is not set; set it to the cluster's Jobs API address"),
    (["--ray", "http://head:8265", "--model", "/data/config.json"],
     "--model /data/config.json: a config file stays on this machine, and --ray runs the setups on the cluster's nodes; pass a preset"),
])
def test_ray_input_is_refused_before_the_cluster_is_asked(args, message, capsys, tmp_path, monkeypatch):
    pytest.importorskip("ray.job_submission", reason="Ray's Jobs API is not installed")
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    code = main(["run", *args, "--out", str(tmp_path / "r.jsonl")])
    err = capsys.readouterr().err
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "r.jsonl").exists()


DATA = Path(__file__).parent / "data"
# Every flag that names a path, given one it cannot use: (command and flags, text of the line).
# "{tmp}" is the test's folder, holding a file "file" and a results file "r.jsonl".
PATH_CASES = [
    (["run", "--plan", "{tmp}/missing.toml"], "cannot read plan {tmp}/missing.toml (No such file"),
    (["run", "--plan", "{tmp}"], "cannot read plan {tmp} (Is a directory)"),
    (["run", "--out", "{tmp}"], "cannot write results to {tmp} (Is a directory)"),
    (["run", "--out", "{tmp}/file/r.jsonl"], "cannot write results to {tmp}/file/r.jsonl"),
    (["run", "--compile-cache", "{tmp}/file"],
     "--compile-cache {tmp}/file is a file; pass --compile-cache a folder you can write to"),
    (["run", "--compile-cache", "{tmp}/file/cache"],
     "--compile-cache {tmp}/file/cache cannot be made: {tmp}/file is a file"),
    (["run", "--compile-cache", "/proc/nope"], "--compile-cache /proc/nope "),
    (["run", "--compile-cache", "{tmp}/file", "--dry-run"], "--compile-cache {tmp}/file is a file"),
    (["run", "--model", "{tmp}/missing.json"], "unknown model '{tmp}/missing.json'"),
    (["run", "--hosts-file", "{tmp}/missing"], "cannot read hosts file {tmp}/missing"),
    (["run", "--host", "a", "--ssh-config", "{tmp}/missing"], "SSH config {tmp}/missing not found"),
    (["tune", "--budget", "1m", "--compile-cache", "{tmp}/file"], "--compile-cache {tmp}/file is a file"),
    (["tune", "--budget", "1m", "--compile-cache", "/proc/nope"], "--compile-cache /proc/nope "),
    (["tune", "--budget", "1m", "--out", "{tmp}"], "cannot read results file {tmp} (Is a directory)"),
    # A file that holds something else: JSON appended to it would spoil both (issue 37).
    (["run", "--out", "{tmp}/file"], "{tmp}/file is not a stepbench results file (none of its "
                                     "first lines is a record); pass a new file or a results file"),
    (["tune", "--budget", "1m", "--out", "{tmp}/file"], "{tmp}/file is not a stepbench results file"),
    (["report", "{tmp}/missing.jsonl"], "results file '{tmp}/missing.jsonl' not found"),
    (["report", "{tmp}/r.jsonl", "--prices", "{tmp}/missing.toml"], "price file '{tmp}/missing.toml' not found"),
    (["report", "{tmp}/r.jsonl", "--out", "{tmp}"], "cannot write {tmp} (Is a directory)"),
    (["report", "{tmp}/r.jsonl", "--plots", "{tmp}/file"], "--plots {tmp}/file is a file; pass a folder"),
    (["report", "{tmp}/r.jsonl", "--plots", "{tmp}/file/plots"], "cannot write the plots into {tmp}/file/plots"),
]


@pytest.mark.parametrize("args, message", PATH_CASES, ids=[" ".join(a) for a, _ in PATH_CASES])
def test_every_bad_path_flag_is_one_line_and_exit_2(args, message, capsys, tmp_path):
    (tmp_path / "file").write_text("not a folder\n")
    shutil.copy(DATA / "v0.1" / "cpu-results.jsonl", tmp_path / "r.jsonl")
    args = [a.replace("{tmp}", str(tmp_path)) for a in args]
    if args[0] != "report":
        args += ["--device", "cpu"] + (["--out", str(tmp_path / "new.jsonl")]
                                       if "--out" not in args else [])
    code = main(args)
    err = capsys.readouterr().err
    assert code == 2, err
    assert message.replace("{tmp}", str(tmp_path)) in err
    # (The report warns about what it read before it fails to write: "no price for 'cpu'".)
    lines = [line for line in err.strip().splitlines() if "warning:" not in line]
    assert "Traceback" not in err and len(lines) == 1, err
    assert not (tmp_path / "new.jsonl").exists()
    assert (tmp_path / "file").read_text() == "not a folder\n"


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
    assert "already in the results file (ok), skipped" in ran


def test_a_libraries_warning_names_its_source_on_the_same_line(capsys):
    import warnings

    from stepbench.errors import show_warnings

    show_warnings("tune")
    warnings.warn_explicit("TypedStorage is deprecated", UserWarning, "/x/torch/storage.py", 7)
    assert capsys.readouterr().err == ("stepbench tune: warning: TypedStorage is deprecated "
                                       "(UserWarning, torch/storage.py:7)\n")
