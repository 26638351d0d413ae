"""Text generation over a cache that grows with the sequence and that the runtime keeps as its own state
(``RuntimeNeeds(cache_layout="growing")``: OpenVINO's ``ReadValue``/``Assign`` variables): the plan of its
``decoder`` program (:func:`plan_growing_decoder`) and the greedy loop's view of it (:class:`GrowingDecoderPrograms`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from typing import Any

import torch

from .decoding import input_names
from .kv_cache import growing_layer, linear_attention_patches, state_layer, step_cache
from .names import DECODER
from .planning import positions_from_mask

__all__ = ["GrowingDecoderPrograms", "growing_forward", "plan_growing_decoder"]


def plan_growing_decoder(model: Any, step: torch.nn.Module, ids: torch.Tensor, mask: torch.Tensor,
                         shapes: list[tuple[torch.Size, torch.Size]], dtype: torch.dtype, rows: int, max_batch: int,
                         max_cache_len: int, prefill_chunk: int, takes_position_ids: bool
                         ) -> tuple[Any, dict[str, Any]]:
    """:func:`~hfexport_dynamo.tasks.causal_lm.plan_decoder` for a cache that grows (``growing``): ``step`` is the
    ``CausalLMStep(model, shapes, dtype, growing=True)`` the program traces. The example holds a past of 2 positions (the
    eager cache of the prompt's first two tokens; torch.export specializes a dim of size 0 or 1) and the prompt after
    it; the past is dynamic from 0 to ``max_cache_len - 1`` positions."""
    from torch.export import Dim
    from transformers import DynamicCache

    from hfexport.plugin import ComponentPlan

    past_ids, past_mask = ids[:, :2], mask[:, :2]
    extra = {"position_ids": positions_from_mask(past_mask)} if takes_position_ids else {}
    with torch.no_grad():
        out = model(input_ids=past_ids, attention_mask=past_mask, cache=DynamicCache(config=model.config),
                    use_cache=True, logits_to_keep=1, **extra)
    # a linear-attention layer (step.state_layers) holds fixed-size states: (conv_state,) or (conv_state,
    # recurrent_state), [batch, ...] whatever the past
    past = tuple(((layer.conv_states[0].detach().clone(), layer.recurrent_states[0].detach().clone())
                  if i in step.recurrent_layers else (layer.conv_states[0].detach().clone(),))
                 if i in step.state_layers else (layer.keys.detach().clone(), layer.values.detach().clone())
                 for i, layer in enumerate(out.cache.layers))
    full_mask = torch.cat([past_mask, mask], -1)
    example: dict[str, Any] = {"input_ids": ids, "attention_mask": full_mask}
    if takes_position_ids:
        example["position_ids"] = positions_from_mask(full_mask)[:, 2:]
    example["cache"] = past
    batch = {0: Dim("batch", min=1, max=max_batch)} if rows > 1 else {}
    seq, held = Dim("seq", min=1, max=prefill_chunk), Dim("past", min=0, max=max_cache_len - 1)
    dynamic_shapes: dict[str, Any] = {"input_ids": {**batch, 1: seq}, "attention_mask": {**batch, 1: Dim.AUTO}}
    if takes_position_ids:
        dynamic_shapes["position_ids"] = {**batch, 1: seq}
    dynamic_shapes["cache"] = tuple(tuple(dict(batch) or None for _ in layer) if i in step.state_layers else
                                    ({**batch, 2: held}, {**batch, 2: held}) for i, layer in enumerate(past))
    cache = {"layout": "[batch, kv_heads, past, head_dim]", "in_program_buffers": False, "growing": True,
             "static_batch": rows == 1, "dtype": str(dtype).removeprefix("torch."), "fused_attention": False,
             "fused_rotary": False, "ignores_padding": False,
             "row_shapes": [[list(k[1:]), list(v[1:])] for k, v in shapes]}
    if step.state_layers:  # {layer: kind} of the fixed-size states, carried as (conv,) or (conv, recurrent)
        cache["state_layers"] = {str(i): "recurrent" if i in step.recurrent_layers else "conv"
                                 for i in sorted(step.state_layers)}
    return ComponentPlan(DECODER, step, example, dynamic_shapes), cache


def growing_forward(step: Any, tokens: dict[str, torch.Tensor], attention_mask: torch.Tensor,
                    position_ids: torch.Tensor | None, cache: Any) -> dict[str, Any]:
    """The forward of a ``CausalLMStep`` over a cache that grows (``growing``): the new positions concatenated, the
    model's own attention. A linear-attention layer (``step.state_layers``) holds fixed-size states instead:
    ``(conv_state,)``, or ``(conv_state, recurrent_state)`` in ``step.recurrent_layers``."""
    seq_len = next(iter(tokens.values())).shape[1]
    # the mask covers the held and the new positions: one symbol less, and the runtime's mask is the same
    past = cache[min(set(range(len(cache))) - step.state_layers)][0].shape[2]
    torch._check(attention_mask.shape[1] == past + seq_len)
    recurrent = step.recurrent_layers
    kv = step_cache([state_layer(held[0], held[1] if i in recurrent else torch.zeros((held[0].shape[0], 1),
                                                                                       dtype=held[0].dtype),
                                 i in recurrent) if i in step.state_layers else growing_layer(*held)
                     for i, held in enumerate(cache)])
    extra = {"position_ids": position_ids} if step.takes_position_ids else {}
    carried = linear_attention_patches(attention_mask, past, step.prefill_chunk, step.disabled_patches) \
        if step.state_layers else contextlib.nullcontext()
    with carried:
        out = step.model(**tokens, attention_mask=attention_mask, cache=kv, use_cache=True, logits_to_keep=1, **extra)
    return {"logits": out.logits, "cache": tuple(
        ((layer.conv_states[0], layer.recurrent_states[0]) if i in recurrent else (layer.conv_states[0],))
        if i in step.state_layers else (layer.keys, layer.values) for i, layer in enumerate(kv.layers))}


class GrowingDecoderPrograms:
    """The ``decoder`` program of a cache that grows (``generation.cache.growing``) under the greedy loop
    (:class:`~hfexport_dynamo.tasks.decoding.TaskPrograms`): the runtime keeps the cache as its own state, so each
    call feeds only the new positions' ``input_ids``, ``position_ids`` and the ``attention_mask`` over the positions
    held and new; the prompt is prefilled in chunks of ``prefill_chunk``.

    The runner keeps the cache: it implements ``reset()`` (an empty cache) and ``run_keeping_cache(inputs)``, which
    takes ``{name: tensor}`` of the program's inputs but the cache and returns the ``logits`` ``[batch, seq, vocab]``
    (:class:`hfexport.plugin.Runner`).
    """

    def __init__(self, exported: Any, section: Mapping[str, Any], input_ids: torch.Tensor,
                 attention_mask: torch.Tensor):
        self.runner = exported.components[DECODER].runner
        if not callable(getattr(self.runner, "run_keeping_cache", None)):
            raise TypeError(f"this artifact's decoder has a growing cache, which {type(self.runner).__name__} does "
                            "not keep (it has no run_keeping_cache())")
        self.takes_positions = "position_ids" in input_names(exported, DECODER)
        rows, prompt = input_ids.shape
        self.rows, self.prompt_ids = rows, input_ids
        # the mask over every position a sequence may hold; a call reads its first past + seq columns
        self.mask = torch.zeros(rows, prompt + section["max_cache_len"], dtype=torch.long)
        self.mask[:, :prompt] = attention_mask
        self.positions = positions_from_mask(attention_mask)
        self.prefill_spans = [slice(past, past + section["prefill_chunk"])
                              for past in range(0, prompt, section["prefill_chunk"])]
        self.past, self.position = prompt, self.positions[:, -1:].clone()
        self.ids = torch.zeros(rows, 1, dtype=torch.long)

    def running(self) -> contextlib.AbstractContextManager[Any]:
        self.runner.reset()
        return contextlib.nullcontext()

    def prefill(self, span: slice) -> torch.Tensor:
        ids = self.prompt_ids[:, span]
        return self._run(ids, self.positions[:, span], span.start + ids.shape[1])

    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        self.mask[:, self.past] = 1
        self.position += 1
        self.ids[:, 0] = tokens
        self.past += 1
        return self._run(self.ids, self.position, self.past)

    def _run(self, ids: torch.Tensor, positions: torch.Tensor, held: int) -> torch.Tensor:
        feed = {"input_ids": ids, "attention_mask": self.mask[:, :held]}
        if self.takes_positions:
            feed["position_ids"] = positions
        return self.runner.run_keeping_cache(feed)[:, -1]
