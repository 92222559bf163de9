"""The Hugging Face workload: a causal LM from a named preset or any config, with random weights,
trained on random token ids with `model(input_ids=x, labels=x).loss`.

Presets are small dicts of LlamaConfig arguments that build on each other; `llama-468m` is the
post's config exactly. `--model PATH` takes a config.json (or a folder holding one) of any causal
LM that transformers knows; no weights are read and nothing is fetched.
"""

from __future__ import annotations

import difflib
import json
import sys
from pathlib import Path

from stepbench.errors import UserError, first_line
from stepbench.workload.base import Built
from stepbench.workload.hfconfig import ROPE_KEYS, defaulted_sizes

# The post's model: LlamaForCausalLM, 468.2M parameters. max_position_embeddings follows --seq.
LLAMA_468M = dict(model_type="llama", vocab_size=32000, hidden_size=1024, intermediate_size=4096,
                  num_hidden_layers=24, num_attention_heads=16, num_key_value_heads=16)
PRESETS: dict[str, dict] = {
    "llama-468m": LLAMA_468M,
    # Same architecture, small enough for a CPU: a step of 4 x 256 tokens takes tens of ms.
    "llama-tiny": {**LLAMA_468M, "vocab_size": 4096, "hidden_size": 128, "intermediate_size": 512,
                   "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 4},
    # SmolLM2-135M's shape (134.5M parameters; tied 49k vocabulary, 3 KV heads): a small model
    # whose eager step waits on kernel launches on a big GPU (compile helps it most).
    "llama-135m": {**LLAMA_468M, "vocab_size": 49152, "hidden_size": 576,
                   "intermediate_size": 1536, "num_hidden_layers": 30, "num_attention_heads": 9,
                   "num_key_value_heads": 3, "tie_word_embeddings": True},
    # A mid-size preset for small GPUs and quick checks (about 40M parameters).
    "llama-small": {**LLAMA_468M, "hidden_size": 512, "intermediate_size": 2048,
                    "num_hidden_layers": 8, "num_attention_heads": 8, "num_key_value_heads": 8},
}


def config_dict(model: str) -> dict:
    """The config as a plain dict: a preset, or a config.json file / a folder holding one."""
    if model in PRESETS:
        return dict(PRESETS[model])
    path = Path(model)
    if not path.exists() and model.endswith(".py"):
        raise UserError(f"--model {model}: name the function that builds the model: "
                        f"--model {model}:make (docs/workloads.md)")
    if not path.exists():
        raise UserError(f"unknown model {model!r}: not a preset ({', '.join(PRESETS)}) and no such "
                        "file; pass a preset name or the path of an HF config.json")
    if path.suffix == ".py":
        raise UserError(f"--model {model}: name the function that builds the model: "
                        f"--model {model}:make (docs/workloads.md)")
    if path.is_dir():
        path = path / "config.json"
        if not path.is_file():
            raise UserError(f"{model}: folder has no config.json; pass a config file or a folder "
                            "holding one")
    try:
        text = path.read_text()
        if not text.strip():
            raise UserError(f"{path}: the file is empty; pass a config.json or a preset")
        data = json.loads(text)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise UserError(f"{path}: not a readable JSON config ({exc}); fix the file or pass a "
                        "preset") from None
    if not isinstance(data, dict):
        raise UserError(f"{path}: holds a JSON {type(data).__name__.replace('dict', 'object')}, "
                        "not an object of the model's settings; pass a config.json")
    if "model_type" not in data:
        raise UserError(f"{path}: no 'model_type' in the config; add it (e.g. \"llama\")")
    return data


def build_config(model: str, seq: int):
    """A transformers config for `model`, checked against the sequence length."""
    from transformers import AutoConfig

    data = config_dict(model)
    model_type = data.pop("model_type")
    for key in ("architectures", "transformers_version", "_name_or_path", "torch_dtype", "dtype",
                "auto_map"):
        data.pop(key, None)
    if model in PRESETS:
        data["max_position_embeddings"] = seq
    known_types = _known_model_types()
    if model_type not in known_types:
        raise _unknown_model_type(model, model_type, known_types)
    _check_rope_type(model, data)
    try:
        cfg = AutoConfig.for_model(model_type, **data)
    # ValueError, KeyError (a RoPE type's missing key), huggingface_hub's strict dataclass
    # errors (neither a ValueError nor a TypeError): the config, not stepbench, is wrong.
    except Exception as exc:  # noqa: BLE001 - any of them is this one line, exit 2
        raise UserError(f"{model}: transformers rejects this {model_type} config "
                        f"({first_line(str(exc))}); fix the config") from None
    defaulted = [] if model in PRESETS else defaulted_sizes(data, cfg)
    if defaulted:
        raise UserError(f"{model}: the config leaves {', '.join(defaulted)} to transformers' "
                        f"{model_type} defaults; give each in the config")
    limit = getattr(cfg, "max_position_embeddings", None)
    if limit is not None and seq > limit:
        raise UserError(f"--seq {seq} is above the model's max_position_embeddings ({limit}); "
                        f"use --seq {limit} or less")
    return cfg


def _check_rope_type(model: str, data: dict) -> None:
    """A RoPE scaling of a type transformers has no function for: one line here, not a KeyError
    in every setup's build (transformers only warns when it reads the config)."""
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    for key in ROPE_KEYS:
        value = data.get(key)
        kind = value.get("rope_type", value.get("type")) if isinstance(value, dict) else None
        if kind is not None and kind != "default" and kind not in ROPE_INIT_FUNCTIONS:
            raise UserError(f"{model}: {key}'s rope_type {kind!r} is not one transformers knows; "
                            f"choose one of: default, {', '.join(ROPE_INIT_FUNCTIONS)}")


def _known_model_types() -> list[str]:
    """The model_type values this transformers knows (about 800 in 5.x)."""
    from transformers import CONFIG_MAPPING

    # keys(): the lazy mapping is an empty dict underneath, so len() says 0.
    return list(CONFIG_MAPPING.keys())


# How to see every type, for the error below: the list itself is too long for an error line.
LIST_MODEL_TYPES = 'python -c "import transformers; print(sorted(transformers.CONFIG_MAPPING))"'


def _unknown_model_type(model: str, model_type, known_types: list[str]) -> UserError:
    """A one-line error for a model_type transformers does not know: the close matches, not all.

    transformers' own ValueError lists every type it knows (12,000 characters in 5.x), which as a
    one-line error buries both the typo and the fix. Types close to the bad one ("lama": "llama")
    catch typos; for a type with none, the model may need a newer transformers.
    """
    close = difflib.get_close_matches(str(model_type), known_types, n=3)
    if close:
        quoted = [repr(name) for name in close]
        choices = quoted[0] if len(quoted) == 1 else f"{', '.join(quoted[:-1])} or {quoted[-1]}"
        fix = f"did you mean {choices}?"
    else:
        fix = "fix the config or upgrade transformers."
    return UserError(f"{model}: transformers does not know model_type {model_type!r}; {fix} "
                     f"All known types: {LIST_MODEL_TYPES}")


def import_modeling(model: str, seq: int) -> None:
    """Import what build_model needs (transformers, the model's own modeling module), so that a
    setup's "imports" phase holds the imports and its "build" phase the building alone."""
    from transformers import AutoModelForCausalLM

    try:
        AutoModelForCausalLM._model_mapping[type(build_config(model, seq))]  # imports the module
    except (AttributeError, KeyError):
        pass    # build_model says what is wrong with a model transformers cannot build


def build_model(model: str, seq: int, attn: str, device="cpu"):
    """A causal LM with random weights drawn on `device`, in fp32; the caller casts it.

    Building in fp32 then calling .to(dtype) avoids the torch_dtype/dtype rename between
    transformers 4.x and 5.x, and draws the same random numbers whatever the dtype. Drawn on a GPU
    (Setup.init "device") the weights take milliseconds, against seconds of single-threaded CPU
    random numbers for a model of llama-468m's size; they are other numbers than the CPU's for the same seed.
    """
    import torch
    from transformers import AutoModelForCausalLM

    cfg = build_config(model, seq)
    with torch.device(device):
        return AutoModelForCausalLM.from_config(cfg, attn_implementation=attn)


def synthetic_batch(vocab_size: int, batch: int, seq: int, seed: int, device: str):
    """Random token ids, the same for every setup with the same seed."""
    import torch

    gen = torch.Generator().manual_seed(seed + 1)
    return torch.randint(0, vocab_size, (batch, seq), generator=gen).to(device)


def check_models(plan) -> None:
    """Every model of `plan` that is a config file, read and checked against its sequence lengths
    before anything runs (a preset is known good, and checking it would import transformers)."""
    for model, seq in dict.fromkeys((s.model, s.seq) for s in plan):
        if model not in PRESETS:
            build_config(model, seq)


class HFBuilt(Built):
    """A causal LM and its token batch; tokens are what its throughput counts."""

    def __init__(self, setup, device, rank: int = 0):
        self.setup = setup
        self.model = build_model(setup.model, setup.seq, setup.attn,
                                 device=device if setup.init == "device" else "cpu")
        from stepbench.measure import options

        self.model.to(device=device, dtype=options.weight_dtype(setup))
        # Data parallel: every rank trains its own tokens; rank 0 the same as a single process.
        # Drawn from a generator of their own: where in the build they are made does not matter.
        self.tokens = synthetic_batch(self.model.config.vocab_size, setup.batch, setup.seq,
                                      setup.seed + rank, setup.device)
        self.inputs = self.tokens
        self.units_per_batch = setup.rank_tokens_per_step

    def loss(self, forward):
        return forward(input_ids=self.tokens, labels=self.tokens).loss

    def layers(self, needed_by: str):
        from stepbench.measure import options

        return options.decoder_layers(self.model, needed_by)

    def enable_checkpointing(self) -> None:
        # Non-reentrant: the variant torch recommends, and the one torch.compile traces.
        self.model.gradient_checkpointing_enable(
            gradient_checkpointing_kwargs={"use_reentrant": False})

    def flop_fields(self, setup, units_per_s: float, peak_tflops_measured, count: bool) -> dict:
        """FLOPs per token, achieved TFLOP/s and MFU, and FlopCounterMode's count as a
        cross-check (without `count`, only where it is cached)."""
        import torch

        from stepbench.measure import flops, machine, options

        model = self.model
        fields = flops.mfu_fields(config=model.config, seq=setup.seq, tokens_per_s=units_per_s,
                                  gpu_name=machine.gpu_name(setup.device),
                                  dtype=setup.compute_dtype,
                                  params_non_embedding=flops.non_embedding_params(model),
                                  peak_tflops_measured=peak_tflops_measured)
        if setup.distributed:
            return fields   # the cross-check needs the unwrapped model; its 1-process record has it
        try:
            # Compiled layers (scope "layer") run eagerly here: the count is the model's, and it
            # must not compile the layers again under the counting mode.
            with torch.compiler.set_stance("force_eager"), options.forward_context(setup):
                per_sequence = flop_counter_per_sequence(setup, model, self.tokens, count)
            if per_sequence is not None:
                fields["flop_counter_per_step"] = setup.batch * per_sequence
        except Exception as exc:  # noqa: BLE001 - a cross-check must not cost the measurement
            print(f"stepbench: FlopCounterMode cross-check failed: {exc}", file=sys.stderr)
        return fields


def _flop_cache():
    from stepbench.measure.cache import JsonCache

    return JsonCache("flops")


def flop_counter_per_sequence(setup, model, tokens, count: bool = True) -> float | None:
    """FlopCounterMode's FLOPs for one sequence's forward + backward: cached, else one counted
    pass at batch 1 (exact: FLOPs are linear in the batch, and it needs no more memory than a
    batch-1 step); without `count`, None where it is not cached.

    What FlopCounterMode counts depends on the model's shape, the sequence length, the attention
    kernel, the precision, fused kernels, activation checkpointing (its recompute) and the
    library versions, not on the batch, mode, compile scope or device: counted once per key."""
    import torch

    from stepbench.measure import flops, machine
    from stepbench.measure.cache import positive_number

    key = {"model": config_dict(setup.model), "seq": setup.seq, "attn": setup.attn,
           "precision": setup.dtype, "kernels": setup.kernels, "checkpointing": setup.checkpointing,
           "torch": torch.__version__, "transformers": machine.software_info()["transformers"]}
    found = _flop_cache().fetch(key, lambda: flops.flop_counter_step(model, tokens[:1]),
                                valid=positive_number, cached_only=not count)
    return None if found is None else float(found[0])
