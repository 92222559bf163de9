"""The post's Llama (stepbench's `llama-468m` preset) written as a user's factory: the same
transformers LlamaForCausalLM from the same config, random weights drawn on the device in fp32
(stepbench casts to the setup's precision, bf16 by default), random token ids, the loss from
`labels`. benchmarks/gpu_factory_overhead.sh runs it beside `--model llama-468m` to measure what
the factory path adds to a setup's process.

    stepbench run --model benchmarks/configs/llama_factory.py:make --attn sdpa
    stepbench run --model benchmarks/configs/llama_factory.py:make --device cpu --seq 64 \\
        --param size=tiny          # llama-tiny's shape, for a CPU
"""

from __future__ import annotations

import torch
from transformers import LlamaConfig, LlamaForCausalLM
from transformers.models.llama.modeling_llama import LlamaDecoderLayer

import stepbench

# Written out as a user would (the preset's LLAMA_468M and llama-tiny, src/stepbench/workload/hf.py).
SIZES = {
    "468m": dict(vocab_size=32000, hidden_size=1024, intermediate_size=4096,
                 num_hidden_layers=24, num_attention_heads=16, num_key_value_heads=16),
    "tiny": dict(vocab_size=4096, hidden_size=128, intermediate_size=512,
                 num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4),
}


def make(batch_size: int, device: str, seq_len: int = 2048, attn: str = "sdpa",
         size: str = "468m"):
    config = LlamaConfig(**SIZES[size], max_position_embeddings=seq_len,
                         attn_implementation=attn)
    with torch.device(device):
        model = LlamaForCausalLM(config)
    gen = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, config.vocab_size, (batch_size, seq_len), generator=gen).to(device)
    return stepbench.Workload(model=model, make_batch=lambda: {"input_ids": tokens, "labels": tokens},
                              units="tokens", units_per_batch=batch_size * seq_len,
                              block=LlamaDecoderLayer)
