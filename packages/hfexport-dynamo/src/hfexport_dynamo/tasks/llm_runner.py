"""ExecuTorch's LLM runner's view of a text-generation decoder: the program takes the two inputs its runner passes
(``tokens``, ``input_pos``) and carries the constant methods it reads (:class:`LLMRunnerStep`). Planned by
:func:`hfexport_dynamo.tasks.causal_lm.plan_decoder` when a backend declares ExecuTorch's LLM kernels
(``RuntimeNeeds(attention="llama::custom_sdpa")``) at ``max_batch=1``.
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["LLMRunnerStep"]


class LLMRunnerStep(torch.nn.Module):
    """A :class:`CausalLMStep` over ExecuTorch's LLM kernels (cache in buffers, one row) with the inputs ExecuTorch's
    LLM runner (``executorch.extension.llm.runner.TextLLMRunner``, its C++ ``TextLLMRunner``) passes to ``forward``.

    Forward:
        input_ids: ``int64 [1, seq]``, the new tokens.
        input_pos: ``int64 [1]``, the position of the first of them (the positions already cached).

    Returns:
        ``{"logits": float [1, vocab]}`` (the last position's).

    Attributes:
        llm_metadata: the constant methods the runner reads (``get_max_seq_len``: the most tokens one call takes;
            ``get_max_context_len``: the cache's capacity; ``get_vocab_size``, ``get_bos_id``, ``get_eos_ids``,
            ``use_kv_cache``, ``use_sdpa_with_kv_cache``, ``enable_dynamic_shape``), for the backend to write.
    """

    def __init__(self, step: torch.nn.Module, max_cache_len: int, prefill_chunk: int):
        super().__init__()
        self.step = step
        self.config, self.generation_config = step.config, step.generation_config
        self.max_cache_len = max_cache_len
        text = step.config.get_text_config(decoder=True)
        generation = step.generation_config
        eos = getattr(generation, "eos_token_id", None)
        eos = getattr(text, "eos_token_id", None) if eos is None else eos
        bos = getattr(generation, "bos_token_id", None)
        bos = getattr(text, "bos_token_id", None) if bos is None else bos
        self.llm_metadata = {
            "get_max_seq_len": int(prefill_chunk), "get_max_context_len": int(max_cache_len),
            "get_vocab_size": int(text.vocab_size), "get_bos_id": int(bos) if bos is not None else 0,
            "get_eos_ids": [int(e) for e in (eos if isinstance(eos, list | tuple) else [eos] if eos is not None else [])],
            "use_kv_cache": True, "use_sdpa_with_kv_cache": True, "enable_dynamic_shape": True,
        }

    def forward(self, input_ids: torch.Tensor, input_pos: torch.Tensor) -> dict[str, Any]:
        seq = input_ids.shape[1]
        past_length = input_pos.reshape(())
        positions = (input_pos + torch.arange(seq, dtype=torch.long))[None]
        mask = (torch.arange(self.max_cache_len, dtype=torch.long) < past_length + seq).long()[None]
        return self.step(input_ids, mask, positions if self.step.takes_position_ids else None, past_length)
