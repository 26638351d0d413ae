"""Model patches (stage 2, ``"dynamo"`` scope) for single model families whose forward torch.export cannot trace
with a dynamic sequence: each replaces one method for the duration of an export with the same computation in
tensor ops, so that every backend (all trace through hfexport-dynamo) gets the class. Each names the model-side
change it waits for; ``disable=("<patch name>",)`` brings the original failure back (the tests do).

Importing this module registers the patches (``exporter_dynamo`` imports it).
"""

from __future__ import annotations

from typing import Any

import torch

from hfexport.plugin import register_patch

__all__: list[str] = []


@register_patch("dynamo", "transformers.models.cpmant.modeling_cpmant.CpmAntModel._prepare_attention_mask")
def _patch_cpmant_left_padding_mask(original: Any) -> Any:
    """Build CPM-Ant's left-padding mask from ``torch.arange`` instead of a Python list sized by the sequence.

    **Why**: ``CpmAntModel._prepare_attention_mask`` writes the positions ``seqlen - prompt_length - 1 ... 0`` as
    ``torch.tensor(list(range(seqlen - self.prompt_length))[::-1])``: a Python list needs a concrete length, so
    torch.export specializes the sequence length to the traced one (``Guard failed: input_ids.size()[1] == 8`` at
    any other length). ``torch.arange(n - 1, -1, -1)`` is the same int64 tensor with a symbolic length.
    **Upstream**: model-side (transformers ``modeling_cpmant.py``), no issue filed.
    **Remove when**: transformers builds the mask with ``torch.arange``.
    """

    def _prepare_attention_mask(self: Any, input_ids: torch.Tensor, span: torch.Tensor, context: torch.Tensor,
                                length: torch.Tensor) -> torch.Tensor:
        batch, seqlen, device = input_ids.size(0), input_ids.size(1), input_ids.device
        directional_mask_2d = torch.arange(seqlen, device=device) <= torch.arange(seqlen, device=device).view(-1, 1)
        attention_mask = context[:, None, :] | (
            context[:, :, None].logical_not() & directional_mask_2d.view(1, seqlen, seqlen))
        attention_mask = attention_mask & (span[:, None, :] == span[:, :, None])
        positions = torch.arange(seqlen - self.prompt_length - 1, -1, -1, device=device)  # the reversed range
        mask_1d = positions[None, :].repeat(batch, 1) < length[:, None]
        mask_1d = torch.cat((torch.ones(batch, self.prompt_length, device=device).bool(), mask_1d), dim=1)
        return mask_1d.view(batch, seqlen, 1) & mask_1d.view(batch, 1, seqlen) & attention_mask

    return _prepare_attention_mask


@register_patch("dynamo",
                "transformers.models.switch_transformers.modeling_switch_transformers.SwitchTransformersTop1Router"
                ".forward")
def _patch_switch_router_cast(original: Any) -> Any:
    """Route without ``self.classifier = self.classifier.to(self.dtype)`` inside ``forward``.

    **Why**: ``SwitchTransformersTop1Router.forward`` replaces its classifier submodule on every call to cast it to
    the router dtype; torch.export cannot trace a submodule being swapped mid-forward (``RuntimeError: Cannot swap
    t1 because it has weakref associated with it``). During an export the classifier already has the router dtype
    (else this raises and names the cast to do), so the cast is a no-op; the rest is the router's eval-mode
    computation (no jitter noise outside training).
    **Upstream**: model-side; the same in-forward cast as NLLB-MoE's router (``_patch_nllb_moe_cast_classifier``).
    **Remove when**: transformers casts the classifier at load time instead of in ``forward``.
    """

    def forward(self: Any, hidden_states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        if self.training:
            return original(self, hidden_states)  # jitter noise; never the case in an export (eval mode)
        weight = getattr(self.classifier, "weight", None)
        if weight is not None and weight.dtype != self.dtype:
            raise TypeError(f"the Switch Transformers router classifier is {weight.dtype} but the router runs in "
                            f"{self.dtype} (config.router_dtype): cast it before exporting, e.g. "
                            f"router.classifier.to({self.dtype})")
        self.input_dtype = hidden_states.dtype
        router_logits = self.classifier(hidden_states.to(self.dtype))
        router_probs = torch.softmax(router_logits, dim=-1, dtype=self.dtype).to(self.input_dtype)
        expert_index = torch.nn.functional.one_hot(torch.argmax(router_probs, dim=-1), num_classes=self.num_experts)
        token_priority = torch.cumsum(expert_index, dim=-2)
        expert_index = expert_index * (token_priority <= self.expert_capacity)  # tokens past capacity: no expert
        router_probs = torch.max(router_probs, dim=-1).values.unsqueeze(-1)
        return expert_index, router_probs, router_logits

    return forward


@register_patch("dynamo",
                "transformers.models.switch_transformers.modeling_switch_transformers.SwitchTransformersExperts"
                ".forward")
def _patch_switch_experts_dense(original: Any) -> Any:
    """Run every Switch Transformers expert on every token, weighted by the router's (capacity-masked) choice.

    **Why**: ``SwitchTransformersExperts.forward`` loops in Python over ``nonzero()`` of the routing mask and
    gathers each expert's tokens with ``torch.where``: a data-dependent loop and data-dependent shapes, which
    torch.export rejects (``GuardOnDataDependentSymNode``). Its experts are separate modules, not the 3-D weights
    that ``_patch_moe_experts_dense`` handles (that patch declines this class). Here each expert runs on all tokens
    and its output is multiplied by ``one_hot(expert) * routing_weight`` (0 for the tokens it was not given, and
    for tokens past the expert capacity): each token's value is eager's exactly, since the other experts add 0.
    Cost: ``num_experts`` times the expert FLOPs of sparse dispatch (top-1 routing).
    **Upstream**: huggingface/transformers#38518 (MoE experts loops not exportable).
    **Remove when**: Switch Transformers moves to transformers' ``use_experts_implementation`` experts.
    """

    def forward(self: Any, hidden_states: torch.Tensor, selected_experts: torch.Tensor,
                routing_weights: torch.Tensor) -> torch.Tensor:
        # hidden_states [tokens, hidden]; selected_experts [tokens, 1, num_experts] one-hot; routing_weights [tokens, 1]
        output = torch.zeros_like(hidden_states)
        for index in range(self.num_experts):
            weight = selected_experts[:, 0, index, None].to(routing_weights.dtype) * routing_weights
            output = output + (self[f"expert_{index}"](hidden_states) * weight).to(hidden_states.dtype)
        return output

    return forward
