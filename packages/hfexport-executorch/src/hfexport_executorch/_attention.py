"""ExecuTorch's fused KV-cache attention for generation programs: ``llama::update_cache`` and ``llama::custom_sdpa``
(``executorch.extension.llm.custom_ops``, the kernels of ExecuTorch's own LLM runner).

``custom_sdpa`` reads the cache only up to ``start + seq`` positions, so a decode step costs what attention reads
at the current context instead of the cache's capacity (seeded Llama of 512 hidden units, 8 layers, 1 thread,
decode at ~64 positions: 51.6 ms at a capacity of 128, 103.8 ms at 2,048 with the masked attention over the whole
capacity; measured on a loaded machine, so the ratio is what counts). ``update_cache`` writes the new positions
into the program's mutable buffers in place. Both are portable kernels that the runtime registers when
:func:`register_llm_kernels` has imported them (the runner does before it loads a program).
"""

from __future__ import annotations

from typing import Any

import torch

from ._quiet import without_temp_allocator_lines

__all__ = ["llm_cache_attention", "register_llm_kernels"]


def register_llm_kernels() -> None:
    """Import ExecuTorch's LLM custom ops: their eager and export implementations, and their runtime kernels."""
    import executorch.extension.llm.custom_ops.custom_ops  # noqa: F401


def llm_cache_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, key_cache: torch.Tensor,
                        value_cache: torch.Tensor, start: Any, scale: float) -> torch.Tensor:
    """``hfexport_dynamo.tasks.kv_cache.InPlaceCacheAttention`` on ExecuTorch's kernels.

    Args:
        query: ``[batch, heads, seq, dim]``; key, value: ``[batch, kv_heads, seq, dim]``.
        key_cache, value_cache: ``[batch, max_cache_len, kv_heads, dim]`` buffers, written at ``start``.
        start: the positions already cached (a SymInt under export).
        scale: the score scale.

    Returns:
        ``[batch, seq, heads, dim]``: causal attention of each query row over the positions up to its own.
    """
    register_llm_kernels()
    with without_temp_allocator_lines():  # the eager kernels log it too (the probe, the verification's eager run)
        torch.ops.llama.update_cache(key.transpose(1, 2), key_cache, start)
        torch.ops.llama.update_cache(value.transpose(1, 2), value_cache, start)
        return torch.ops.llama.custom_sdpa(query.transpose(1, 2), key_cache, value_cache, start, None, 0.0, True,
                                           scale)
