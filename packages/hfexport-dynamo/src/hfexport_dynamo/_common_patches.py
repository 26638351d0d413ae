"""Capture's model patches (stage 2, ``@register_patch("dynamo", ...)``) that are not of one model family: torch ops
and transformers' shared code (experts dispatch, dynamic RoPE). The single-family ones are in ``_model_patches.py``,
the shifted-window padding in ``_window_padding.py``, the recurrences in ``_recurrences.py``; ``capture.py`` imports
them all, so that every backend's capture installs them."""

from __future__ import annotations

import functools
import inspect
from typing import Any

import torch

from hfexport.plugin import register_patch

from ._moe import dense_experts_forward, experts_wrapper_code, fits_dense_experts


@register_patch("dynamo", "torch.masked_select", "torch.Tensor.masked_select")
def _patch_masked_select(original: Any) -> Any:
    """Traces ``masked_select(x, mask)`` as ``broadcast_tensors`` and a boolean index of both flattened,
    ``x.reshape(-1)[mask.reshape(-1)]``: the same values in the same row-major order.

    **Why**: torch's fake ``masked_select`` bounds its unbacked length by the *input's* numel, not by the broadcast
    numel. An input that broadcasts against a larger mask (``bias[6].masked_select(x[rows, 6] > 0.5)``, s52) then
    fails on every backend: the ``.pt2`` with ``Runtime assertion failed for expression u1 <= 6``, ExecuTorch (which
    plans the output for that bound) with ``Attempted to resize a bounded tensor with a maximum capacity of 6
    elements to 12 elements``. A boolean index is bounded by the mask's numel, the broadcast one; ONNX lowers it to
    ``NonZero`` + ``GatherND`` either way.
    **Upstream**: pytorch/executorch#13585 (the same resize failure for ``masked_select``, open).
    **Remove when**: torch bounds ``masked_select`` by the broadcast numel (s52 runs on dynamo with
    ``disable=("_patch_masked_select",)``).
    """

    @functools.wraps(original)
    def masked_select(input: Any, mask: Any, *args: Any, **kwargs: Any) -> Any:
        if args or kwargs or not isinstance(input, torch.Tensor) or not isinstance(mask, torch.Tensor):
            return original(input, mask, *args, **kwargs)
        # the input broadcasts when it has fewer dims or a static 1 against a mask dim that is not (no guard:
        # static sizes only; a dynamic dim is never 1)
        pairs = zip(reversed(input.shape), reversed(mask.shape), strict=False)
        if input.dim() >= mask.dim() and not any(type(i) is int and i == 1 and not (type(m) is int and m == 1)
                                                 for i, m in pairs):
            return original(input, mask)  # the input's numel is the broadcast numel: its bound is right
        values, keep = torch.broadcast_tensors(input, mask)
        return values.reshape(-1)[keep.reshape(-1)]

    return masked_select


@register_patch("dynamo", "torch._C._conv_determine_backend_memory_format")
def _patch_conv_memory_format_without_guards(original: Any) -> Any:
    """Pick a convolution's memory format in fake-tensor tracing from the traced sizes, without guarding on them.

    **Why**: torch's fake ``convolution`` asks ATen which memory format the CPU backend would give its output
    (``_subclasses/fake_impls.py``, ``_conv_determine_backend_memory_format``); ATen reads the symbolic sizes and
    strides of the input to tell channels-last from contiguous, which guards on them. Where a size is 1 at the
    traced shape those guards bound the input: ConvNext traced at 32x32 is 1x1 at its last stage, and the guard
    ``(h//32) <= 1`` bounds the image to [32, 63] (added again by ExecuTorch's lowering of a channels-last graph,
    after the trace, so that the program plans memory for 63 while its range says 64 and a 64x64 input fails
    with ``Failed to resize output tensor for XNNExecutor``); ``(h//16) > 1`` sets the lower bound at 32. The
    format only decides the fake output's strides, which the traced size answers as well as any: the replacement
    asks ATen about a tensor of the traced sizes and strides (uninitialized, never read) and adds no guard.
    **Upstream**: pytorch/pytorch, fake ``convolution`` evaluates ``suggest_memory_format`` with guards (no issue
    found; unchanged on main).
    **Remove when**: torch decides the fake memory format size-obliviously (the tiny ConvNext traced at 32x32 runs
    at 64x64 on executorch-xnnpack with ``disable=("_patch_conv_memory_format_without_guards",)``).
    """
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    def hint(size: Any) -> int | None:
        if isinstance(size, torch.SymInt):
            return size.node.hint if isinstance(size.node.hint, int) else None
        return int(size)

    def traced(tensor: Any) -> Any:
        if not isinstance(tensor, torch.Tensor) or not any(
                isinstance(s, torch.SymInt) for s in (*tensor.shape, *tensor.stride())):
            return tensor
        sizes, strides = [hint(s) for s in tensor.shape], [hint(s) for s in tensor.stride()]
        if None in sizes or None in strides:
            return None  # unbacked: no traced size to ask about
        with unset_fake_temporarily():
            return torch.empty_strided(sizes, strides, dtype=tensor.dtype, device=tensor.device)

    @functools.wraps(original)
    def determine(input: Any, weight: Any, *args: Any, **kwargs: Any) -> Any:
        concrete_input, concrete_weight = traced(input), traced(weight)
        if concrete_input is None or concrete_weight is None:
            return original(input, weight, *args, **kwargs)
        return original(concrete_input, concrete_weight, *args, **kwargs)

    return determine


@register_patch("dynamo", "transformers.models.nllb_moe.modeling_nllb_moe.NllbMoeTop2Router._cast_classifier")
def _patch_nllb_moe_cast_classifier(original: Any) -> Any:
    """Skip NLLB-MoE's in-forward ``self.classifier = self.classifier.to(self.dtype)``.

    **Why**: the router reassigns a submodule inside ``forward`` to cast it to the router dtype (a guard
    for bitsandbytes layers). torch.export cannot trace a module attribute being replaced mid-forward.
    During an export the model is already in one dtype, so the cast is a no-op and can be skipped.
    **Upstream**: model-side; transformers casts in forward instead of at load time
    (``NllbMoeTop2Router._cast_classifier``).
    **Remove when**: the cast moves out of ``forward`` (e.g. into ``_init_weights``/load hooks).
    """

    def cast_classifier(self: Any) -> None:
        weight = getattr(self.classifier, "weight", None)
        if weight is not None and weight.dtype != self.dtype:
            raise TypeError(f"NllbMoe router classifier is {weight.dtype} but the router runs in {self.dtype}: "
                            "cast the model to one dtype before exporting")

    return cast_classifier


@register_patch("dynamo", "transformers.models.*.modeling_*.*Experts.forward")
def _patch_moe_experts_dense(original: Any) -> Any:
    """Dispatch MoE experts densely: every expert on every token, combined by the router's top-k weights.

    **Why**: transformers' experts dispatch has no implementation that every backend lowers. ``eager``
    (``MixtralExperts.forward`` and every ``@use_experts_implementation`` class) loops in Python over
    ``nonzero()`` of the routing mask and indexes with ``torch.where``: data-dependent loop length and shapes,
    which torch.export rejects on every backend (``GuardOnDataDependentSymNode``). The default ``grouped_mm``
    sorts tokens by expert and counts them with ``aten.histc`` (not Core ATen: ExecuTorch rejects it) before
    the custom op ``transformers::grouped_mm_fallback`` (no ONNX translation). The replacement computes each
    expert's output for all tokens with batched matmuls and sums them weighted by a dense (tokens, experts)
    matrix built from ``top_k_index == arange(num_experts)``: only matmul, comparison, where and sum, static
    in the number of experts and dynamic in tokens. It honours the decorator's contract (``has_gate``,
    ``has_bias``, ``is_transposed``, the class's ``_apply_gate``, ``post_expert_norm``), so it is the value
    of every built-in implementation up to float rounding. Cost: ``num_experts / top_k`` times the expert
    FLOPs of sparse dispatch; no gathered copies of the weights (``batched_mm``'s tokens x top_k weight
    gather grows with the prompt).
    Declined: a ``forward`` that is not ``use_experts_implementation``'s wrapper (the wildcard also matches
    ``*Experts`` classes with per-expert modules); at call time, an instance whose weights are not the generic
    3-D floating layout (quantized experts) or whose ``config._experts_implementation`` is a user's own
    registration runs the original.
    **Upstream**: huggingface/transformers#38518 (eager MoE loop not exportable; PRs #40114, #46929).
    **Remove when**: transformers ships an experts implementation without data-dependent shapes, histc or
    custom ops, selected for export (then select it here instead of patching).
    """
    code = experts_wrapper_code()
    if code is None or getattr(original, "__code__", None) is not code:
        return original  # not transformers' experts dispatch: decline

    signature = inspect.signature(getattr(original, "__wrapped__", original))  # the class's eager forward

    @functools.wraps(original)
    def forward(self: Any, *args: Any, **kwargs: Any) -> torch.Tensor:
        if kwargs:  # (hidden_states, top_k_index, top_k_weights) under the class's own parameter names
            bound = signature.bind(self, *args, **kwargs)
            args, kwargs = bound.args[1:], bound.kwargs
        if len(args) != 3 or kwargs or not fits_dense_experts(self):
            return original(self, *args, **kwargs)
        return dense_experts_forward(self, *args)

    return forward


def _is_dynamic_rope_wrapper(forward: Any) -> bool:
    """Whether ``forward`` is the wrapper that ``transformers.modeling_rope_utils.dynamic_rope_update`` returns."""
    from transformers.modeling_rope_utils import dynamic_rope_update

    code = getattr(forward, "__code__", None)
    return code is not None and code is dynamic_rope_update(lambda *a, **k: None).__code__ and \
        hasattr(forward, "__wrapped__")


@register_patch("dynamo", "transformers.models.*.modeling_*.*RotaryEmbedding.forward")
def _patch_dynamic_rope_update(original: Any) -> Any:
    """Select the dynamic-NTK RoPE frequencies with tensor ops instead of a Python branch on the length.

    **Why**: ``dynamic_rope_update`` recomputes ``inv_freq`` when ``max(position_ids) + 1`` exceeds the cached
    length, with ``if seq_len > max_seq_len_cached``: a Python branch on a data-dependent value, which
    torch.export rejects (``GuardOnDataDependentSymNode: Eq(u0, 1)``) on every backend. The replacement
    computes the scaled frequencies from the runtime length (the rope init functions accept a tensor
    ``seq_len``) and picks them with ``torch.where(seq_len > original_max_seq_len, scaled, original)``, then
    runs the undecorated forward with that ``inv_freq``. This is the value eager computes for a model that
    has not seen a longer sequence before; eager's growth cache (``max_seq_len_cached``) is process state that
    an exported program cannot carry. ``longrope`` already selects with ``torch.where`` in transformers 5 and
    is left to the original; every rope type whose name contains ``dynamic`` takes this path.
    **Upstream**: pytorch/pytorch#163791 (reported on Phi-3.5 longrope; the same branch remains in the
    dynamic NTK update of ``transformers.modeling_rope_utils.dynamic_rope_update``).
    **Remove when**: transformers' dynamic update selects with ``torch.where`` like its longrope update.
    """
    if not _is_dynamic_rope_wrapper(original):
        return original  # not decorated with dynamic_rope_update: decline
    undecorated = original.__wrapped__

    def forward(self: Any, x: torch.Tensor, position_ids: torch.Tensor, layer_type: str | None = None) -> Any:
        rope_type = self.rope_type if layer_type is None else self.rope_type[layer_type]
        kwargs = {"layer_type": layer_type} if layer_type is not None else {}
        if "dynamic" not in rope_type:
            return original(self, x, position_ids, **kwargs)
        from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

        prefix = f"{layer_type}_" if layer_type is not None else ""
        original_inv_freq = getattr(self, f"{prefix}original_inv_freq").to(x.device)
        seq_len = torch.max(position_ids) + 1
        scaled, _ = ROPE_INIT_FUNCTIONS[rope_type](self.config, x.device, seq_len=seq_len, **kwargs)
        inv_freq = torch.where(seq_len > self.original_max_seq_len, scaled.to(original_inv_freq.dtype),
                               original_inv_freq)
        name = f"{prefix}inv_freq"
        saved = self._buffers[name]
        self._buffers[name] = inv_freq
        try:
            return undecorated(self, x, position_ids, **kwargs)
        finally:
            self._buffers[name] = saved

    return forward


