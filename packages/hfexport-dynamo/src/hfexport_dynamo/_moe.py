"""Transformers' MoE experts as one dense computation: what ``_patch_moe_experts_dense`` runs at export time.

Every expert runs on every token; the routing weights, scattered to a dense (tokens, experts) matrix, combine
them. Same values as transformers' experts implementations (eager, grouped_mm, batched_mm), with no
data-dependent shape, ``aten.histc`` or custom op for a backend to lower.
"""

from __future__ import annotations

import functools
from typing import Any

import torch

__all__ = ["dense_experts_forward", "experts_wrapper_code", "fits_dense_experts", "is_builtin_experts_implementation"]


@functools.cache
def experts_wrapper_code() -> Any:
    """The code object of the ``forward`` that ``transformers.integrations.moe.use_experts_implementation`` puts
    on an experts class (``None`` where this transformers has no such decorator)."""
    try:
        from transformers.integrations.moe import use_experts_implementation
    except ImportError:
        return None
    probe = use_experts_implementation(type("_ExpertsProbe", (torch.nn.Module,), {"forward": lambda self: None}))
    return probe.forward.__code__


def is_builtin_experts_implementation(name: str | None) -> bool:
    """Whether ``config._experts_implementation`` names one that transformers itself ships (eager, grouped_mm,
    batched_mm, ...): all compute the same function of the expert weights, so the dense formulation stands in
    for any of them. A user's own registration (even under a built-in name) is left alone."""
    if name is None:
        return True
    from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS

    function = ALL_EXPERTS_FUNCTIONS.get(name)
    if function is None:
        return name == "eager"  # the class's own forward
    return getattr(function, "__module__", "").startswith("transformers.")


def fits_dense_experts(experts: Any) -> bool:
    """Whether ``experts`` has the layout of transformers' generic experts (``use_experts_implementation``'s
    contract): 3-D ``gate_up_proj``/``up_proj`` and ``down_proj`` in a floating dtype, the decorator's flags."""
    config = getattr(experts, "config", None)
    if not is_builtin_experts_implementation(getattr(config, "_experts_implementation", None)):
        return False
    if not all(hasattr(experts, a) for a in ("num_experts", "has_gate", "has_bias", "is_transposed")):
        return False
    if not experts.has_gate and not hasattr(experts, "act_fn"):
        return False
    up_name = "gate_up_proj" if experts.has_gate else "up_proj"
    weights = [getattr(experts, up_name, None), getattr(experts, "down_proj", None)]
    if not all(isinstance(w, torch.Tensor) and w.dim() == 3 and w.shape[0] == experts.num_experts
               and w.dtype in (torch.float32, torch.float16, torch.bfloat16, torch.float64) for w in weights):
        return False  # quantized (float8 and scales) or split per-expert modules: not this formulation
    if experts.has_gate and not getattr(experts, "is_concatenated", True) \
            and "_apply_gate" not in vars(type(experts)):
        return False  # interleaved gate/up needs the class's own _apply_gate
    return not (getattr(experts, "has_post_expert_norm", False) and not hasattr(experts, "post_expert_norm"))


def dense_experts_forward(self: Any, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
                           top_k_weights: torch.Tensor) -> torch.Tensor:
    """Every expert on every token, combined with the routing weights scattered to a dense (tokens, experts)
    matrix: the value of transformers' experts implementations, with no data-dependent shape anywhere."""
    num_experts = self.num_experts
    experts = torch.arange(num_experts, device=top_k_index.device, dtype=top_k_index.dtype)
    # (tokens, top_k, experts) -> (tokens, experts); an index outside [0, num_experts) (expert-parallel
    # sentinel, eager's `continue`) selects no expert
    hit = top_k_index.unsqueeze(-1) == experts
    weights = (hit.to(top_k_weights.dtype) * top_k_weights.unsqueeze(-1)).sum(dim=1)
    selected = hit.any(dim=1).transpose(0, 1).unsqueeze(-1)  # (experts, tokens, 1)

    def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        out = torch.matmul(x, weight if self.is_transposed else weight.transpose(1, 2))  # (experts, tokens, out)
        return out if bias is None else out + bias.unsqueeze(1)

    up_name = "gate_up_proj" if self.has_gate else "up_proj"
    proj = linear(hidden_states, getattr(self, up_name), getattr(self, f"{up_name}_bias") if self.has_bias else None)
    proj = self._apply_gate(proj) if self.has_gate else self.act_fn(proj)
    proj = linear(proj, self.down_proj, self.down_proj_bias if self.has_bias else None)
    if getattr(self, "has_post_expert_norm", False):
        proj = self.post_expert_norm(proj)
    # experts a token did not pick contribute exactly 0 (where, not 0 * value: an unpicked expert's inf/NaN
    # in half precision must not leak into the sum)
    weighted = torch.where(selected, proj * weights.transpose(0, 1).unsqueeze(-1), 0)
    return weighted.sum(dim=0).to(hidden_states.dtype)
