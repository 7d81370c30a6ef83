"""A small GPT-2 (nanoGPT-style) whose attention is chosen per layer.

``GPTConfig.attn`` is the attention spec of every layer (see :mod:`kernels.gpt2.attention`);
``GPTConfig.layer_attn`` overrides single layers, e.g. ``{1: "paper"}`` with ``attn="sdpa"`` runs
the paper's bf16 flash attention in layer 1 only (a spec is a string or a parsed
:class:`kernels.gpt2.attention.AttnSpec`, as :class:`kernels.gpt2.config.TrainConfig` gives it)
(layers are numbered from 0 here; the paper's "layer 2" is our layer 1).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
import torch.nn as nn
import torch.nn.functional as F

from .attention import attend, parse_spec
from .diagnostics import AttentionProbe, wq_head_norms


@dataclass
class GPTConfig:
    vocab_size: int = 256
    block_size: int = 256  # context length
    n_layer: int = 4
    n_head: int = 4
    n_embd: int = 256
    bias: bool = True
    attn: str = "sdpa"
    layer_attn: dict = field(default_factory=dict)  # {layer index: spec}
    qk_norm: bool = False  # LayerNorm on q and k (a known cure for logit growth; off by default)

    def __post_init__(self):
        if self.n_embd % self.n_head:
            raise ValueError(f"n_embd ({self.n_embd}) must be divisible by n_head ({self.n_head})")
        for layer in self.layer_attn:
            if not 0 <= int(layer) < self.n_layer:
                raise ValueError(
                    f"layer_attn names layer {layer}, but the model has {self.n_layer} layers "
                    "(0-based)"
                )
        parse_spec(self.attn)

    def spec(self, layer: int):
        return parse_spec(self.layer_attn.get(layer, self.layer_attn.get(str(layer), self.attn)))


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: GPTConfig, layer: int):
        super().__init__()
        self.n_head, self.spec = cfg.n_head, cfg.spec(layer)
        self.c_attn = nn.Linear(cfg.n_embd, 3 * cfg.n_embd, bias=cfg.bias)  # x -> [Q; K; V]
        self.c_proj = nn.Linear(cfg.n_embd, cfg.n_embd, bias=cfg.bias)
        hd = cfg.n_embd // cfg.n_head
        self.q_norm = nn.LayerNorm(hd) if cfg.qk_norm else None
        self.k_norm = nn.LayerNorm(hd) if cfg.qk_norm else None
        self.probe = AttentionProbe()

    def forward(self, x):
        b, n, c = x.shape
        q, k, v = self.c_attn(x).split(c, dim=2)
        q, k, v = (t.view(b, n, self.n_head, c // self.n_head).transpose(1, 2) for t in (q, k, v))
        if self.q_norm is not None:
            q, k = self.q_norm(q).to(v.dtype), self.k_norm(k).to(v.dtype)
        y = attend(q, k, v, self.spec, self.probe)  # (B, H, N, D)
        if self.probe.active and torch.is_grad_enabled():
            norms = wq_head_norms(self.c_attn.weight, self.n_head)
            self.probe.observe(x, q, k, v, y, norms)
            y.register_hook(self.probe.backward_hook)
        y = y.transpose(1, 2).contiguous().view(b, n, c)
        return self.c_proj(y)


class MLP(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.c_fc = nn.Linear(cfg.n_embd, 4 * cfg.n_embd, bias=cfg.bias)
        self.c_proj = nn.Linear(4 * cfg.n_embd, cfg.n_embd, bias=cfg.bias)

    def forward(self, x):
        return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))


class Block(nn.Module):
    def __init__(self, cfg: GPTConfig, layer: int):
        super().__init__()
        self.ln_1, self.attn = (
            nn.LayerNorm(cfg.n_embd, bias=cfg.bias),
            CausalSelfAttention(cfg, layer),
        )
        self.ln_2, self.mlp = nn.LayerNorm(cfg.n_embd, bias=cfg.bias), MLP(cfg)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.cfg = cfg
        self.wte = nn.Embedding(cfg.vocab_size, cfg.n_embd)
        self.wpe = nn.Embedding(cfg.block_size, cfg.n_embd)
        self.blocks = nn.ModuleList(Block(cfg, i) for i in range(cfg.n_layer))
        self.ln_f = nn.LayerNorm(cfg.n_embd, bias=cfg.bias)
        self.lm_head = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)
        self.lm_head.weight = self.wte.weight  # weight tying, as in GPT-2
        self.apply(self._init)
        for name, p in self.named_parameters():  # GPT-2's scaled init of residual projections
            if name.endswith("c_proj.weight"):
                nn.init.normal_(p, 0.0, 0.02 / math.sqrt(2 * cfg.n_layer))

    @staticmethod
    def _init(module):
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, 0.0, 0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, 0.0, 0.02)

    def forward(self, idx, targets=None):
        b, n = idx.shape
        if n > self.cfg.block_size:
            raise ValueError(
                f"sequence of {n} tokens is longer than the context {self.cfg.block_size}"
            )
        x = self.wte(idx) + self.wpe(torch.arange(n, device=idx.device))
        for block in self.blocks:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        if targets is None:
            return logits, None
        loss = F.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.reshape(-1))
        return logits, loss

    def set_monitoring(self, on: bool):
        for block in self.blocks:
            block.attn.probe.active = on

    def layer_stats(self) -> list[dict]:
        return [dict(block.attn.probe.stats) for block in self.blocks]

    def wq_norms(self) -> list[list[float]]:
        """‖W_Q‖₂ per layer and head."""
        return [wq_head_norms(b.attn.c_attn.weight, self.cfg.n_head) for b in self.blocks]

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())
