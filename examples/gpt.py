"""A plain-PyTorch GPT (GPT-2's shape by default: 124M parameters) for `stepbench run --model
examples/gpt.py:make`: pre-norm blocks, causal self-attention through
torch.nn.functional.scaled_dot_product_attention, tied embeddings, next-token cross-entropy.

    stepbench run --model examples/gpt.py:make --batch 8 --seq 1024
    stepbench run --model examples/gpt.py:make --device cpu --seq 64 \\
        --param n_layer=2 --param n_embd=64 --param n_head=2 --param vocab_size=512
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

import stepbench


class Attention(nn.Module):
    def __init__(self, n_embd: int, n_head: int):
        super().__init__()
        self.n_head = n_head
        self.qkv = nn.Linear(n_embd, 3 * n_embd)
        self.proj = nn.Linear(n_embd, n_embd)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(x).split(c, dim=2)
        q, k, v = (y.view(b, t, self.n_head, c // self.n_head).transpose(1, 2) for y in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).contiguous().view(b, t, c))


class Block(nn.Module):
    def __init__(self, n_embd: int, n_head: int):
        super().__init__()
        self.ln_1 = nn.LayerNorm(n_embd)
        self.attn = Attention(n_embd, n_head)
        self.ln_2 = nn.LayerNorm(n_embd)
        self.mlp = nn.Sequential(nn.Linear(n_embd, 4 * n_embd), nn.GELU(approximate="tanh"),
                                 nn.Linear(4 * n_embd, n_embd))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, vocab_size: int, seq_len: int, n_layer: int, n_head: int, n_embd: int):
        super().__init__()
        self.wte = nn.Embedding(vocab_size, n_embd)
        self.wpe = nn.Embedding(seq_len, n_embd)
        self.blocks = nn.ModuleList(Block(n_embd, n_head) for _ in range(n_layer))
        self.ln_f = nn.LayerNorm(n_embd)
        self.lm_head = nn.Linear(n_embd, vocab_size, bias=False)
        self.lm_head.weight = self.wte.weight           # tied, as GPT-2
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, std=0.02)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        for block in self.blocks:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        return F.cross_entropy(logits.view(-1, logits.size(-1)).float(), targets.view(-1))


def make(batch_size: int, device: str, seq_len: int = 1024, vocab_size: int = 50304,
         n_layer: int = 12, n_head: int = 12, n_embd: int = 768):
    """GPT-2 124M (vocabulary padded to 50304) unless told smaller; tokens per batch counted."""
    with torch.device(device):
        model = GPT(vocab_size, seq_len, n_layer, n_head, n_embd)
    gen = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, vocab_size, (batch_size, seq_len + 1), generator=gen).to(device)
    inputs, targets = tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()
    return stepbench.Workload(model=model, make_batch=lambda: (inputs, targets),
                              units="tokens", units_per_batch=batch_size * seq_len, block=Block)
