"""Patches of scope ``"dynamo.text_generation"``: transformers' linear-attention code that decides by the length
of the new positions (a guard on the dynamic ``seq`` of the text-generation ``decoder`` program), for the layers
whose states that program carries (LFM2's conv layers, the gated delta nets of Qwen3-Next and its siblings).

The text-generation step (:class:`hfexport_dynamo.tasks.causal_lm.CausalLMStep`) installs them itself, around each
of its forwards, through the patch context (:func:`hfexport.workarounds.patch_context`), with the data of that call
in :data:`CARRIED` and :data:`NEW_POSITIONS`: its eager forward is the program's computation too (the verification's
reference runs after the export's patches are reverted), so the patches must hold there as well. Without that data
each replacement calls transformers' function unchanged. ``disable=("<patch name>",)`` leaves one out of the step
(the capture hands the export's ``disable`` to the step: ``CausalLMStep.disabled_patches``).

Importing this module registers the patches (``tasks/kv_cache.py`` imports it).
"""

from __future__ import annotations

import contextvars
from dataclasses import dataclass, field
from typing import Any

import torch

from hfexport.plugin import register_patch

__all__ = ["CARRIED", "CONV_MASK_FAMILIES", "GATED_DELTA_FAMILIES", "NEW_POSITIONS", "SCOPE", "CarriedStates"]

SCOPE = "dynamo.text_generation"  # installed by the text-generation step around its forward, not by the capture
# transformers' model families whose gated delta net calls ``torch_chunk_gated_delta_rule`` from its modeling module
GATED_DELTA_FAMILIES = ("qwen3_next", "qwen3_5", "qwen3_5_moe", "olmo_hybrid")
# ... and those whose linear-attention layers take ``create_recurrent_attention_mask``'s 2-D padding mask
CONV_MASK_FAMILIES = ("lfm2", "lfm2_moe", "lfm3", *GATED_DELTA_FAMILIES)


@dataclass
class CarriedStates:
    """One forward's carried recurrent states: the layer that last asked the step's cache for its recurrent state
    (``read``: ``(layer, state_idx)``, set by the cache; transformers' layers ask right before their rule) and the
    length to which the chunked rule pads its inputs (the ``seq`` dim's bound)."""

    length: int
    read: list[tuple[Any, int]] = field(default_factory=list)


CARRIED: contextvars.ContextVar[CarriedStates | None] = contextvars.ContextVar("hfexport_carried_states", default=None)
# (attention_mask over the cache or the positions held and new, the number of positions held before this call)
NEW_POSITIONS: contextvars.ContextVar[tuple[torch.Tensor, Any] | None] = contextvars.ContextVar(
    "hfexport_new_positions", default=None)


def _modeling(families: tuple[str, ...], name: str) -> tuple[str, ...]:
    return tuple(f"transformers.models.{family}.modeling_{family}.{name}" for family in families)


@register_patch(SCOPE, *_modeling(GATED_DELTA_FAMILIES, "torch_chunk_gated_delta_rule"))
def _patch_chunked_rule_from_carried_state(original: Any) -> Any:
    """Run the chunked gated delta rule from the carried recurrent state, for any number of new positions (one
    included), over its inputs padded to a static length.

    **Why**: transformers' gated delta net picks its per-token rule on ``recurrent_state is not None and seq_len ==
    1``: a guard on the program's dynamic ``seq`` that would specialize it to one token (or to prompts). The step's
    cache reports no previous state, so the layer always takes the chunked rule; here that rule starts from the
    state the layer asked for (``initial_state``). The rule pads the sequence to whole chunks by ``(chunk - seq %
    chunk) % chunk`` (a guard on the number of chunks); padded here to the ``seq`` bound rounded up to whole chunks,
    it pads nothing more. Padded positions (zero query, key, value, beta and log-decay) add exact zeros to the
    outputs and leave the state as it is (a state times ``exp(0)``): below one chunk, the padding transformers'
    rule does itself. Greedy ids equal eager ``generate``'s, which decodes by the per-token rule.
    **Upstream**: model-side (transformers ``modeling_qwen3_next.py`` and its copies: the rule chosen by the
    Python length), no issue filed.
    **Remove when**: transformers' layer runs the chunked rule from the cache's state for any length, or chooses
    the rule with a traceable condition, and pads by a static amount.
    """

    def from_carried_state(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, g: torch.Tensor,
                           beta: torch.Tensor, chunk_size: int = 64, initial_state: torch.Tensor | None = None,
                           **kwargs: Any) -> Any:
        carried = CARRIED.get()
        if carried is None:
            return original(query, key, value, g=g, beta=beta, chunk_size=chunk_size, initial_state=initial_state,
                            **kwargs)
        layer, state_idx = carried.read.pop() if carried.read else (None, 0)
        if initial_state is None and layer is not None and layer.is_recurrent_states_initialized[state_idx]:
            initial_state = layer.recurrent_states[state_idx]
        seq = query.shape[1]  # [batch, seq, heads, dim]; g and beta [batch, seq, heads]
        padding = -(-carried.length // chunk_size) * chunk_size - seq
        query, key, value = (torch.nn.functional.pad(x, (0, 0, 0, 0, 0, padding)) for x in (query, key, value))
        g, beta = (torch.nn.functional.pad(x, (0, 0, 0, padding)) for x in (g, beta))
        out, state = original(query, key, value, g=g, beta=beta, chunk_size=chunk_size, initial_state=initial_state,
                              **kwargs)
        return out[:, :seq], state

    return from_carried_state


@register_patch(SCOPE, *_modeling(CONV_MASK_FAMILIES, "create_recurrent_attention_mask"))
def _patch_recurrent_mask_at_new_positions(original: Any) -> Any:
    """Give the linear-attention layers' 2-D padding mask at the new positions ``past .. past + seq - 1`` of the
    step's mask, for any number of new positions.

    **Why**: transformers' ``create_recurrent_attention_mask`` returns None for one new position (``inputs_embeds.
    shape[1] == 1``: a guard on the program's dynamic ``seq``) and otherwise the mask's last ``seq`` positions,
    which is right only for a mask that ends at the new positions: the step's mask spans the cache's whole capacity
    (positions not written yet are 0 there), so the layers would zero their inputs. Here the mask is read at the
    new positions, whatever the length: a generated token is 1 there, as transformers' None means.
    **Upstream**: model-side (transformers ``masking_utils.create_recurrent_attention_mask``, imported by name into
    each modeling module), no issue filed.
    **Remove when**: transformers takes the new positions from ``cache_position`` (or the cache's length) and
    drops the length test.
    """

    def at_new_positions(config: Any, inputs_embeds: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        held = NEW_POSITIONS.get()
        if held is None:
            return original(config, inputs_embeds, *args, **kwargs)
        attention_mask, past = held
        positions = torch.arange(inputs_embeds.shape[1], device=attention_mask.device) + past
        return attention_mask[:, positions]

    return at_new_positions
