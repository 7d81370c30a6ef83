"""The attention layers a monitor reads: finding them in a model, their head count, and how
their fused [Q; K; V] projection (or GPTBigCode's [Q; K-V] layouts) is cut into heads. A layout
the monitor does not know is refused with a message naming the module and what was expected.
"""

from __future__ import annotations

import torch

from .metrics import finite_spectral_norm

HEAD_COUNT_NAMES = ("n_head", "num_heads", "n_heads", "num_attention_heads")
LAYOUTS = {
    "qkv": "[Q; K; V], each n_embd wide (nanoGPT, the book's GPT-2, Hugging Face GPT-2)",
    "per_head": "per head [q; k; v], each head_dim wide (GPTBigCode, multi_query=False)",
    "mqa": "[Q; K; V] with one key/value head of head_dim (GPTBigCode, multi_query=True)",
}
KNOWN_LAYOUTS = {
    "CausalSelfAttention": "qkv",
    "GPT2Attention": "qkv",
    "GPT2SdpaAttention": "qkv",
    "GPT2FlashAttention2": "qkv",
    "DecisionTransformerGPT2Attention": "qkv",
}
KV_HEAD_NAMES = ("kv_heads", "num_key_value_heads", "n_kv_head", "n_kv_heads")


def _compiled(module) -> bool:
    """True for a torch.compile wrapper or a module compiled in place
    (``module.compile()``), at the top or anywhere inside (per-block compile)."""
    return any(
        hasattr(m, "_orig_mod") or getattr(m, "_compiled_call_impl", None) is not None
        for m in module.modules()
    )


def _training_marks(layers) -> list:
    """What a training pass changes in the attention layers whether or not their hooks run:
    each ``c_attn`` weight's version and its gradient's identity and version."""
    marks = []
    for layer in layers:
        weight = layer.module.c_attn.weight
        grad = weight.grad
        marks.append((weight._version, None if grad is None else (id(grad), grad._version)))
    return marks


def _what_dynamo_compiled(model) -> str:
    """What torch.compile has compiled in this process that runs ``model``: the classes of
    its modules whose forward has compiled code, else how many graphs it made ('' if
    none)."""
    try:
        from torch._dynamo.eval_frame import _debug_get_cache_entry_list
        from torch._dynamo.utils import counters

        classes = {type(m) for m in model.modules()}
        named = sorted(
            f"{cls.__name__}.forward"
            for cls in classes
            if _debug_get_cache_entry_list(cls.forward.__code__)
        )
        graphs = counters["stats"]["unique_graphs"]
    except (ImportError, AttributeError, TypeError, KeyError):
        return ""
    if named:
        return f"torch.compile has compiled {', '.join(named)} in this process"
    return f"torch.compile has compiled {graphs} graph(s) in this process" if graphs else ""


def _compiled_before(model, step) -> str:
    """Why an armed step trained the attention layers without calling the hooks."""
    evidence = _what_dynamo_compiled(model)
    if evidence:
        return (
            f"the model runs through code compiled by torch.compile before the monitor "
            f"was attached ({evidence}; a torch.compile wrapper of the model, "
            f"model.compile(), a compiled training step or a Trainer's torch_compile "
            f"option): step {step} trained its attention layers without calling the "
            f"monitor's hooks"
        )
    return (
        f"step {step} trained the attention layers without calling the monitor's "
        "hooks: the model runs through compiled code (torch.compile before the monitor "
        "was attached, torch.jit or an exported program)"
    )


def _has_padding(mask) -> bool:
    """True when an attention mask hides a key that the causal mask would show."""
    if not isinstance(mask, torch.Tensor) or mask.dim() < 2:
        return False
    nq, nk = mask.shape[-2:]
    shown = torch.ones(nq, nk, dtype=torch.bool, device=mask.device).tril(nk - nq)
    hidden = ~mask if mask.dtype == torch.bool else mask < 0
    return bool((hidden & shown).any())


def _head_count(module, name: str, n_head) -> int:
    if n_head is not None:
        return int(n_head)
    for attr in HEAD_COUNT_NAMES:
        value = getattr(module, attr, None)
        if isinstance(value, int) and value > 0:
            return value
    raise ValueError(
        f"attention layer {name!r} has no head count (looked for "
        f"{', '.join(HEAD_COUNT_NAMES)}): pass n_head= to attach"
    )


def query_weight(c_attn: torch.nn.Module, width: int) -> torch.Tensor:
    """The (3C, C) weight making [Q; K; V]: nn.Linear's as is, Conv1D's transposed."""
    w = c_attn.weight
    if tuple(w.shape) == (3 * width, width):
        return w
    if tuple(w.shape) == (width, 3 * width):
        return w.T
    raise ValueError(
        f"c_attn weight of shape {tuple(w.shape)} is neither (3C, C) nor "
        f"(C, 3C) for a width C = {width}"
    )


def _out_in_weight(c_attn: torch.nn.Module) -> torch.Tensor:
    """c_attn's weight as (outputs, inputs): nn.Linear's as is, Hugging Face's Conv1D
    (which stores (inputs, outputs)) transposed."""
    w = c_attn.weight
    return w.T if type(c_attn).__name__ == "Conv1D" else w


def _layout(name: str, module, layout) -> str:
    """How q, k, v sit in c_attn's output; refuses what the monitor cannot know."""
    cls = type(module).__name__
    if layout is not None:
        if layout not in LAYOUTS:
            raise ValueError(f"layout must be one of {', '.join(LAYOUTS)}, got {layout!r}")
        return layout
    if cls.startswith("GPTBigCode"):
        multi = getattr(module, "multi_query", None)
        if not isinstance(multi, bool):
            raise ValueError(
                f"layer {name!r} ({cls}) has no multi_query flag: cannot tell "
                f"whether its c_attn output is {LAYOUTS['per_head']} or "
                f"{LAYOUTS['mqa']}; pass layout="
            )
        return "mqa" if multi else "per_head"
    if cls in KNOWN_LAYOUTS:
        return KNOWN_LAYOUTS[cls]
    raise ValueError(
        f"layer {name!r} is a {cls}, a class the monitor does not know: it has c_attn "
        f"and c_proj, but how q, k and v sit in c_attn's output cannot be told from the "
        f"weights. Expected one of {', '.join(sorted(KNOWN_LAYOUTS))} or GPTBigCode; if "
        f"your layer splits c_attn's output as nanoGPT does, pass layout='qkv' "
        f"({LAYOUTS['qkv']}); the other layouts: "
        + "; ".join(f"{key!r}: {text}" for key, text in LAYOUTS.items() if key != "qkv")
    )


def find_attention(model: torch.nn.Module) -> list[tuple[str, torch.nn.Module]]:
    """(name, module) of each self-attention layer the monitor can read, in order."""
    found = []
    for name, module in model.named_modules():
        children = dict(module.named_children())
        if (
            "c_attn" in children
            and "c_proj" in children
            and not getattr(module, "is_cross_attention", False)
        ):
            found.append((name, module))
    return found


def _writes() -> bool:
    """Rank 0 of a process group, or no process group: this process reads, writes."""
    dist = torch.distributed
    return not (dist.is_available() and dist.is_initialized()) or dist.get_rank() == 0


class _Layer:
    """One attention layer: where to hook it and how to cut its tensors into heads."""

    def __init__(self, index, name, module, n_head, layout=None):
        self.index, self.name, self.module = index, name, module
        self.n_head = _head_count(module, name, n_head)
        self.layout = _layout(name, module, layout)
        weight = _out_in_weight(module.c_attn)
        self.width = int(weight.shape[1])
        if self.width % self.n_head:
            raise ValueError(
                f"layer {name!r}: width {self.width} is not divisible by {self.n_head} heads"
            )
        self.head_dim = self.width // self.n_head
        kv_heads = 1 if self.layout == "mqa" else self.n_head
        for attr in KV_HEAD_NAMES:
            value = getattr(module, attr, None)
            if isinstance(value, int) and value != kv_heads:
                raise ValueError(
                    f"layer {name!r} ({type(module).__name__}) has {attr} = "
                    f"{value}, but layout {self.layout!r} has {kv_heads} "
                    "key/value heads: grouped-query attention is not read"
                )
        outputs = self.width + 2 * kv_heads * self.head_dim
        if tuple(weight.shape) != (outputs, self.width):
            raise ValueError(
                f"layer {name!r} ({type(module).__name__}): c_attn makes "
                f"{weight.shape[0]} outputs from {weight.shape[1]} inputs, but layout "
                f"{self.layout!r} ({LAYOUTS[self.layout]}) with {self.n_head} heads "
                f"expects {outputs} outputs"
            )
        scale = getattr(module, "scaling", None)
        self.scale = float(scale) if isinstance(scale, (int, float)) else None

    def wq_norms(self) -> list[float]:
        """‖W_Q‖₂ of each head, from the rows of c_attn's weight that make its q (NaN for
        a head whose weights hold NaN or inf, or have no data)."""
        w, d = _out_in_weight(self.module.c_attn), self.head_dim
        first = (lambda h: 3 * d * h) if self.layout == "per_head" else (lambda h: d * h)
        return [finite_spectral_norm(w[first(h) : first(h) + d]) for h in range(self.n_head)]

    def split(self, qkv: torch.Tensor):
        """(B, N, outputs) → q, k, v of shape (B, H, N, D), with the layer's q/k norms if
        it has them (applied under the autocast state of the layer's own forward pass)."""
        b, n, _ = qkv.shape
        d = self.head_dim
        if self.layout == "per_head":
            q, k, v = qkv.reshape(b, n, self.n_head, 3 * d).transpose(1, 2).split(d, -1)
        elif self.layout == "mqa":
            q, k, v = qkv.split((self.width, d, d), dim=-1)
            q = q.reshape(b, n, self.n_head, d).transpose(1, 2)
            k, v = (
                t.reshape(b, n, 1, d).transpose(1, 2).expand(b, self.n_head, n, d) for t in (k, v)
            )
        else:
            q, k, v = (
                t.reshape(b, n, self.n_head, -1).transpose(1, 2)
                for t in qkv.split(self.width, dim=-1)
            )
        q_norm, k_norm = (getattr(self.module, a, None) for a in ("q_norm", "k_norm"))
        if isinstance(q_norm, torch.nn.Module) and isinstance(k_norm, torch.nn.Module):
            q, k = q_norm(q).to(v.dtype), k_norm(k).to(v.dtype)
        return q, k, v

    def heads(self, out: torch.Tensor) -> torch.Tensor:
        """(B, N, C) with heads side by side → (B, H, N, D)."""
        b, n, _ = out.shape
        return out.reshape(b, n, self.n_head, -1).transpose(1, 2)
