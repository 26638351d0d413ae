"""``hfexport::cache_attention``: attention that writes a step's keys and values into a KV cache of fixed capacity
and reads only the positions filled so far, as one op that a backend lowers to its runtime's fused kernel.

Traced as one node, it keeps the cache write and the attention together, so a backend whose runtime has such a
kernel (ONNX Runtime's ``com.microsoft.GroupQueryAttention``, which writes into a present buffer shared with the
past one and reads ``past_length + seq`` positions, not the whole capacity) can lower it to that kernel
(``RuntimeNeeds(attention="hfexport::cache_attention")``). Its eager implementation, used by the verification's eager run, is the
plain computation: write, then attend over the cache under the mask.

With a rotary table (``rotary_cos``/``rotary_sin``, the model's RoPE at every cache position, and ``position_ids``)
the op also applies RoPE to the query and the new keys, as transformers' ``apply_rotary_pos_emb`` does (the halves
form, ``q * cos + rotate_half(q) * sin``): a backend then rotates them with its runtime's rotary kernel (ONNX
Runtime's ``RotaryEmbedding``, one node per tensor) instead of a dozen small nodes per layer.
"""

from __future__ import annotations

import torch

__all__ = ["CACHE_ATTENTION", "LLAMA_CUSTOM_SDPA", "attention_for", "cache_attention", "llama_cache_attention"]


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rotary(x: torch.Tensor, rotary_cos: torch.Tensor, rotary_sin: torch.Tensor,
                 position_ids: torch.Tensor) -> torch.Tensor:
    """RoPE of ``x [batch, heads, seq, dim]`` at ``position_ids [batch, seq]`` from the tables ``[positions, dim / 2]``,
    in transformers' halves form and operation order (``x * cos + rotate_half(x) * sin``: the same values)."""
    cos = torch.cat((rotary_cos, rotary_cos), dim=-1)[position_ids].unsqueeze(1)
    sin = torch.cat((rotary_sin, rotary_sin), dim=-1)[position_ids].unsqueeze(1)
    return (x * cos) + (_rotate_half(x) * sin)


@torch.library.custom_op("hfexport::cache_attention", mutates_args=())
def cache_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, past_key: torch.Tensor,
                    past_value: torch.Tensor, past_length: torch.Tensor, mask: torch.Tensor, scale: float,
                    rotary_cos: torch.Tensor | None = None, rotary_sin: torch.Tensor | None = None,
                    position_ids: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Grouped-query attention of ``seq`` new positions over a cache, with the cache write.

    Args:
        query: ``[batch, heads, seq, head_dim]`` (RoPE applied, unless the rotary table is given).
        key: ``[batch, kv_heads, seq, head_dim]``, the new positions' (the same); ``heads % kv_heads == 0``.
        value: ``[batch, kv_heads, seq, head_dim]``.
        past_key: ``[batch, kv_heads, max_cache_len, head_dim]``, the cache (positions ``>= past_length`` unused).
        past_value: as ``past_key``.
        past_length: ``int64 []``, the positions already cached; the new ones go to ``past_length + i``.
        mask: ``bool [batch, 1, seq, max_cache_len]``, True where a query may attend a position (causal, padding
            and window applied); a row without any True key attends uniformly, as transformers' eager attention
            with the dtype's minimum as the masked score.
        scale: the score scale (``head_dim ** -0.5`` for most models).
        rotary_cos: ``[max_positions, head_dim / 2]``, the RoPE cosines of every position (the first half of
            transformers' ``cos``, whose halves are equal), or None (query and key come rotated).
        rotary_sin: as ``rotary_cos``, the sines.
        position_ids: ``int64 [batch, seq]``, each new position's RoPE position (with the tables only).

    Returns:
        ``(out [batch, seq, heads, head_dim], present_key, present_value)``: the presents are the caches with the
        new positions written (the same shapes as the pasts).
    """
    if rotary_cos is not None:
        query = apply_rotary(query, rotary_cos, rotary_sin, position_ids)
        key = apply_rotary(key, rotary_cos, rotary_sin, position_ids)
    start = int(past_length)
    seq = key.shape[2]
    present_key, present_value = past_key.clone(), past_value.clone()
    present_key[:, :, start:start + seq] = key
    present_value[:, :, start:start + seq] = value
    groups = query.shape[1] // key.shape[1]
    keys = present_key.repeat_interleave(groups, dim=1)
    values = present_value.repeat_interleave(groups, dim=1)
    scores = (query @ keys.transpose(-1, -2)) * scale
    scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
    out = torch.softmax(scores.float(), dim=-1).to(query.dtype) @ values
    return out.transpose(1, 2).contiguous(), present_key, present_value


@cache_attention.register_fake
def _(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, past_key: torch.Tensor, past_value: torch.Tensor,
      past_length: torch.Tensor, mask: torch.Tensor, scale: float, rotary_cos: torch.Tensor | None = None,
      rotary_sin: torch.Tensor | None = None,
      position_ids: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    batch, heads, seq, _ = query.shape
    out = query.new_empty((batch, seq, heads, value.shape[-1]))
    return out, torch.empty_like(past_key), torch.empty_like(past_value)


# ── the attention ops a backend may declare (``RuntimeNeeds.attention``) ───────────────────────────────────────────
CACHE_ATTENTION = "hfexport::cache_attention"
LLAMA_CUSTOM_SDPA = "llama::custom_sdpa"


def llama_cache_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, key_cache: torch.Tensor,
                          value_cache: torch.Tensor, start: object, scale: float) -> torch.Tensor:
    """Attention over a KV cache in a program's buffers, on ExecuTorch's LLM kernels ``llama::update_cache`` and
    ``llama::custom_sdpa`` (``executorch.extension.llm.custom_ops``, imported by :func:`attention_for` when a backend declares them):
    writes ``key``/``value`` at ``start`` into the buffers in place and attends causally over the positions up to
    each query row's own, reading only ``start + seq`` positions.

    Args:
        query: ``[batch, heads, seq, dim]``; key, value: ``[batch, kv_heads, seq, dim]`` (RoPE applied).
        key_cache, value_cache: ``[batch, max_cache_len, kv_heads, dim]`` buffers, written at ``start``.
        start: the positions already cached (a SymInt under export).
        scale: the score scale.

    Returns:
        ``[batch, seq, heads, dim]``.
    """
    torch.ops.llama.update_cache(key.transpose(1, 2), key_cache, start)
    torch.ops.llama.update_cache(value.transpose(1, 2), value_cache, start)
    return torch.ops.llama.custom_sdpa(query.transpose(1, 2), key_cache, value_cache, start, None, 0.0, True, scale)


def attention_for(attention: str | None, in_place: bool) -> object:
    """What the generation planner traces a cached attention as, for a backend's declared ``attention`` op:
    ``False`` (plain ops), ``True`` (``hfexport::cache_attention``) or, over cache buffers kept in place, the kernel
    :func:`llama_cache_attention`.

    Raises:
        ValueError: an op hfexport cannot trace (names those it can), or ``llama::custom_sdpa`` without an in-place
            cache.
        ImportError: ``llama::custom_sdpa`` without executorch installed.
    """
    if attention is None:
        return False
    if attention == CACHE_ATTENTION:
        return True
    if attention == LLAMA_CUSTOM_SDPA:
        if not in_place:
            raise ValueError(f"attention {LLAMA_CUSTOM_SDPA!r} writes the cache buffers in place: declare it with "
                             "RuntimeNeeds(cache_layout='in_place')")
        try:  # registers the ops (eager, fake and runtime kernels) for the planner's probe and the eager reference
            import executorch.extension.llm.custom_ops.custom_ops  # noqa: F401
        except ImportError as exc:
            raise ImportError(f"attention {LLAMA_CUSTOM_SDPA!r} is ExecuTorch's LLM kernel: pip install executorch "
                              "(or hfexport-executorch, which brings it)") from exc
        return llama_cache_attention
    raise ValueError(f"RuntimeNeeds.attention {attention!r} is not an op hfexport traces; it traces None (plain ops), "
                     f"{CACHE_ATTENTION!r} and {LLAMA_CUSTOM_SDPA!r}")
