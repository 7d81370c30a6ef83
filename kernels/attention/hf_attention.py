"""The fix that held in training, for your own model: the book's FlashAttention-2 kernels
(:func:`kernels.attention.flash_attention`) with δ taken from rowsum(dP ∘ P) instead of
rowsum(dO ∘ O), so the backward pass never reads the rounded output O (chapter 7: with δ
from dP∘P the failing path trained in 3 of 3 seeds).

Hugging Face (registered with transformers' ``AttentionInterface`` under :data:`NAME`)::

    from kernels.attention import hf_attention
    hf_attention.register()
    model = GPT2LMHeadModel(GPT2Config(..., attn_implementation=hf_attention.NAME))
    # or from_pretrained(..., attn_implementation=hf_attention.NAME), or, on a model
    # already built: model.set_attn_implementation(hf_attention.NAME)

nanoGPT (a drop-in for the one SDPA call in ``CausalSelfAttention.forward``)::

    from kernels.attention.hf_attention import scaled_dot_product_attention
    y = scaled_dot_product_attention(q, k, v, is_causal=True)

What it does not do, and says so when asked: attention dropout, padding masks (it
registers SDPA's mask function, so a padded batch reaches it as a mask and is refused
rather than silently ignored), grouped-query heads, head dims other than 16, 32, 64,
128, and query lengths other than the key length or 1 (generation with a cache of more
than one new token). Under BF16 autocast it runs the kernels in BF16; without autocast
in the tensors' own dtype.
"""

from __future__ import annotations

import torch

from .autograd import flash_attention
from .options import options_from

NAME = "book_dp_attention"  # no "flash" in it: transformers reads that as its own kernels


def _hides_a_visible_key(mask) -> bool:
    """True when a mask (bool: True = keep; float: −inf = hide) hides a key causality shows."""
    if not isinstance(mask, torch.Tensor) or mask.dim() < 2:
        return False
    keep = mask if mask.dtype == torch.bool else mask >= 0
    return bool((~keep & torch.ones_like(keep).tril(keep.shape[-1] - keep.shape[-2])).any())


def _options(causal: bool, scale):
    return options_from(
        {
            "causal": bool(causal),
            "scale": None if scale is None else float(scale),
            "delta_source": "dp",
        }
    )


def _same_dtype(*tensors):
    """q, k, v in one dtype: under autocast, the one autocast computes in."""
    if torch.is_autocast_enabled(tensors[0].device.type):
        dtype = torch.get_autocast_dtype(tensors[0].device.type)
    else:
        dtype = tensors[0].dtype
    return [t.to(dtype) for t in tensors]


def _refuse(*rules) -> None:
    """Raise a ValueError with the message of the first ``(broken, message)`` that holds."""
    for broken, message in rules:
        if broken:
            raise ValueError(message)


def _attention(query, key, value, causal: bool, scale):
    """The book's kernels in the dtype autocast computes in (or the tensors' own)."""
    with torch.autocast(query.device.type, enabled=False):
        q, k, v = _same_dtype(query, key, value)
        return flash_attention(q, k, v, _options(causal, scale))


def scaled_dot_product_attention(
    query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False
):
    """``torch.nn.functional.scaled_dot_product_attention``'s signature, computed by the
    book's kernels with δ from rowsum(dP ∘ P). (B, H, N, D) tensors; no mask other
    than the causal one, no dropout, no grouped-query heads."""
    _refuse(
        (
            attn_mask is not None,
            "the book's attention takes no attn_mask: use is_causal=True for "
            "causal attention (padding masks are not supported)",
        ),
        (
            dropout_p,
            f"the book's attention has no dropout, got dropout_p="
            f"{dropout_p!r}: set the attention dropout to 0",
        ),
        (
            enable_gqa or query.shape[-3] != key.shape[-3],
            f"the book's attention needs as many key/value heads as query "
            f"heads, got {query.shape[-3]} and {key.shape[-3]} (grouped-query "
            "attention is not supported)",
        ),
    )
    return _attention(query, key, value, is_causal, scale)


def attention_forward(
    module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs
):
    """The function transformers calls for ``attn_implementation=NAME``: (B, H, N, D)
    q, k, v in; the output as (B, N, H, D) and no attention weights out."""
    where = f"{NAME} ({type(module).__name__})"
    n_q, n_k = query.shape[-2], key.shape[-2]
    heads, kv_heads = query.shape[-3], key.shape[-3]
    _refuse(
        (
            dropout,
            f"{where} has no attention dropout, got p = {dropout or 0:g}: "
            "build the model with attn_pdrop=0 (or config.attention_dropout=0)",
        ),
        (
            _hides_a_visible_key(attention_mask),
            f"{where} got an attention mask with padding: it reads "
            "causal attention without padding only; pack the sequences or "
            "train this batch with attn_implementation='sdpa'",
        ),
        (
            getattr(module, "is_causal", True) is False,
            f"{where} reads causal self-attention only; this layer "
            "is not causal (cross-attention?)",
        ),
        (
            n_q not in (n_k, 1),
            f"{where}: {n_q} queries against {n_k} keys; it takes "
            "equal lengths (training) or one new query (generation)",
        ),
        (
            kv_heads != heads,
            f"{where}: {kv_heads} key/value heads for {heads} query heads "
            f"({heads // kv_heads} per group); grouped-query attention is not supported",
        ),
    )
    out = _attention(query, key, value, n_q == n_k and n_q > 1, scaling)
    return out.transpose(1, 2), None


def causal_or_sdpa_mask(*args, **kwargs):
    """The mask function registered with the attention: ``None`` (no mask tensor at all) for
    plain causal attention without padding, which the kernels' causal flag computes;
    otherwise SDPA's mask, so padding and packed sequences reach the attention as a mask and
    are refused there.

    SDPA's own mask function builds the full mask under ``torch.compile`` in some versions of
    transformers; reading it back (does it hide a key?) is a host sync, which breaks the graph
    in every layer and makes Dynamo recompile per layer."""
    from transformers.masking_utils import causal_mask_function, sdpa_mask

    plain = (
        kwargs.get("attention_mask") is None
        and kwargs.get("mask_function", causal_mask_function) is causal_mask_function
        and kwargs.get("local_size") is None
        and not args
    )
    return None if plain else sdpa_mask(*args, **kwargs)


def register(name: str = NAME) -> str:
    """Register the attention (and :func:`causal_or_sdpa_mask`, so padding reaches it as a
    mask) with transformers under ``name``; returns the name to pass as
    ``attn_implementation``."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    from .options import use_explicit

    use_explicit()  # asks the device once now, not while torch.compile traces the first call
    AttentionInterface.register(name, attention_forward)
    AttentionMaskInterface.register(name, causal_or_sdpa_mask)
    return name


__all__ = [
    "NAME",
    "register",
    "attention_forward",
    "causal_or_sdpa_mask",
    "scaled_dot_product_attention",
]
