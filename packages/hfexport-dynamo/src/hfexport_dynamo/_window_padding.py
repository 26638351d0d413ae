"""Patches (stage 2, ``"dynamo"`` scope) that pad a dynamic size to a multiple of a window, and slice back,
without asking torch.export the parity of the size: two for shifted-window vision models (Swin and the families
that copy its layers), two for torch itself (``contiguous()`` and the ``tensor_meta`` of such a slice), which every
model that pads and slices back needs (odd/even grids, pixel shuffles).

Importing this module registers the patches (``exporter_dynamo`` imports it).
"""

from __future__ import annotations

import functools
from typing import Any

import torch
import torch.nn.functional as F

from hfexport.plugin import register_patch

__all__: list[str] = []

# The families that copy Swin's layer ("# Copied from transformers.models.swin.modeling_swin.SwinLayer"), each with
# its window layer and its patch merging.
_FAMILIES = (
    ("swin.modeling_swin", "Swin"),
    ("swinv2.modeling_swinv2", "Swinv2"),
    ("donut.modeling_donut_swin", "DonutSwin"),
    ("maskformer.modeling_maskformer_swin", "MaskFormerSwin"),
    ("clap.modeling_clap", "ClapAudio"),
    ("swin2sr.modeling_swin2sr", "Swin2SR"),
)


def _symbolic(*sizes: Any) -> bool:
    return any(isinstance(s, torch.SymInt) for s in sizes)


class _PaddedUpTo:
    """A pad amount reported by a window layer's ``maybe_pad`` under a dynamic size: ``> 0`` holds, so the layer
    always slices its output back to the unpadded size (``[:, :height, :width]``, a no-op when nothing was padded)
    instead of branching on ``(window - size % window) % window > 0``."""

    def __init__(self, amount: Any):
        self.amount = amount

    def __gt__(self, other: Any) -> bool:
        return True

    def __repr__(self) -> str:
        return f"_PaddedUpTo({self.amount})"


@register_patch("dynamo", *(f"transformers.models.{module}.{prefix}Layer.maybe_pad" for module, prefix in _FAMILIES))
def _patch_window_padding_without_parity_guard(original: Any) -> Any:
    """A Swin window layer's padding to a multiple of the window, reported so that the layer always slices back.

    **Why**: ``SwinLayer.forward`` pads ``[batch, height, width, channels]`` to multiples of the window
    (``maybe_pad``) and slices back only ``if pad_values[3] > 0 or pad_values[5] > 0``. With a dynamic height or
    width the pad amount is ``(window - size % window) % window``, so torch.export records a guard on the size's
    parity (window 2) and the program is specialized to half the sizes: e11's tiny SwinModel, traced at 7x9
    patches, failed at 5x11 with "Guard failed: (2 + -1 * ((1 + pixel_values.size()[3] // 4) // 2 % 2)) % 2 > 0".
    The replacement pads as before (``F.pad`` takes a symbolic amount, 0 included) and reports the two amounts as
    :class:`_PaddedUpTo`, so the layer slices ``[:, :height, :width]`` every time, which is the identity when
    nothing was padded. Static sizes keep the original (plain ints, no guard). Swin, Swinv2, Donut-Swin,
    MaskFormer-Swin, CLAP's audio encoder and Swin2SR share the layer (``# Copied from``).
    **Upstream**: huggingface/transformers, the ``if pad_values[3] > 0 or pad_values[5] > 0`` branch in each copy
    of ``SwinLayer.forward``; huggingface/optimum#1810 tracks Swin's failures with the dynamo exporters;
    pytorch/pytorch#136216 (open) asks torch.export to see through the same ``if pad > 0`` padding.
    **Remove when**: the layers slice unconditionally (or ``torch.export`` proves the slice a no-op without a
    guard); the test exports a tiny Swin at an odd grid and runs it at an even one with
    ``disable=("_patch_window_padding_without_parity_guard",)`` to see the guard fail.
    """

    @functools.wraps(original)
    def maybe_pad(self: Any, hidden_states: torch.Tensor, height: Any, width: Any) -> Any:
        window = self.window_size
        if not _symbolic(height, width, window):
            return original(self, hidden_states, height, width)
        # the padded size as ``window * ceil(size / window)``: the form the shape solver simplifies the window
        # partition's views with (``(window - size % window) % window`` left it unable to prove them equal)
        pad_right = window * ((width + window - 1) // window) - width
        pad_bottom = window * ((height + window - 1) // window) - height
        hidden_states = F.pad(hidden_states, (0, 0, 0, pad_right, 0, pad_bottom))
        return hidden_states, (0, 0, 0, _PaddedUpTo(pad_right), 0, _PaddedUpTo(pad_bottom))

    return maybe_pad


@register_patch("dynamo",
                *(f"transformers.models.{module}.{prefix}PatchMerging.maybe_pad" for module, prefix in _FAMILIES))
def _patch_patch_merging_pad_without_parity_guard(original: Any) -> Any:
    """A Swin patch merging's padding of an odd grid, done for every size: pad by ``(width % 2, height % 2)``.

    **Why**: ``SwinPatchMerging.maybe_pad`` pads ``[batch, height, width, channels]`` by one row or column only
    ``if (height % 2 == 1) or (width % 2 == 1)``: with a dynamic grid torch.export records a guard on the parity
    of the size, and the program refuses the sizes of the other parity (the same kind as
    ``_patch_window_padding_without_parity_guard``). Padding by ``size % 2`` always gives the same values (a pad
    of 0 is the identity) without the branch. Static sizes keep the original.
    **Upstream**: huggingface/transformers, the branch in each copy of ``SwinPatchMerging.maybe_pad`` (Swin,
    Swinv2, Donut-Swin, MaskFormer-Swin, CLAP, Swin2SR).
    **Remove when**: the merging pads unconditionally; the test exports a tiny Swin with an odd grid before a
    merging and runs it at an even one with ``disable=("_patch_patch_merging_pad_without_parity_guard",)``.
    """

    @functools.wraps(original)
    def maybe_pad(self: Any, input_feature: torch.Tensor, height: Any, width: Any) -> torch.Tensor:
        if not _symbolic(height, width):
            return original(self, input_feature, height, width)
        # ``2 * ((size + 1) // 2) - size`` is ``size % 2``, in the form of the merged grid the model computes next
        # (``(size + 1) // 2``), so that the solver proves the two equal
        return F.pad(input_feature, (0, 0, 0, 2 * ((width + 1) // 2) - width, 0, 2 * ((height + 1) // 2) - height))

    return maybe_pad


def _statically_contiguous(tensor: torch.Tensor) -> bool:
    """Whether ``tensor``'s strides are the contiguous ones for every size its symbols may take (no guard)."""
    from torch.fx.experimental.symbolic_shapes import statically_known_true

    expected: Any = 1
    for size, stride in reversed(tuple(zip(tensor.shape, tensor.stride(), strict=True))):
        if statically_known_true(size == 1):
            continue
        if not statically_known_true(stride == expected):
            return False
        expected = expected * size
    return True


@register_patch("dynamo", "torch.fx.experimental.proxy_tensor._extract_tensor_metadata",
                "torch.fx.passes.shape_prop._extract_tensor_metadata", "torch._export.pass_base._extract_tensor_metadata",
                "torch._higher_order_ops.utils._extract_tensor_metadata")
def _patch_tensor_metadata_without_contiguity_guard(original: Any) -> Any:
    """Record a traced tensor's memory format (``node.meta["tensor_meta"]``) only where it holds for every size,
    without a guard on the sizes.

    **Why**: while tracing, torch records each node's ``tensor_meta``; ``_extract_tensor_metadata`` asks whether
    the value is contiguous with ``is_contiguous_for_memory_format_or_false``, which avoids guards only on
    data-dependent sizes: on a dynamic size it records a guard. A slice back to the unpadded size
    (``padded[:, :height, :width]``: Swin's window layers, odd/even grids, pixel shuffles) is contiguous exactly when
    nothing was padded, so recording its metadata guarded the parity of the size (e11, after the window patches:
    ``Ne(32*Max(1, ((s4//4) + 1)//2), 16*(s4//4))`` from ``check_contiguous_sizes_strides``) and the program
    refused the other half of the sizes. The replacement records the memory format where the tensor is contiguous
    for every size (as torch's comment above the function intends: "set contiguity when it's always true") and
    leaves it unset otherwise; nothing else changes.
    **Upstream**: pytorch/pytorch#123592 (ezyang: the guard comes from "trying to query contiguity on every
    intermediate result"); pytorch/pytorch#185084 removed the size-1 part of it for the metadata path, not the
    stride comparison that guards here (torch 2.15).
    **Remove when**: recording ``tensor_meta`` adds no guard on a dynamic size; the test traces a slice of a padded
    tensor at an odd size and runs it at an even one with ``disable=("_patch_tensor_metadata_without_contiguity_guard",)``.
    """

    @functools.wraps(original)
    def _extract_tensor_metadata(result: torch.Tensor, include_contiguity: bool = True) -> Any:
        if include_contiguity and isinstance(result, torch.Tensor) and not result.is_sparse and (
                _symbolic(*result.shape) and not _statically_contiguous(result)):
            include_contiguity = False  # contiguous for some sizes only: the format stays unset (None)
        return original(result, include_contiguity=include_contiguity)

    return _extract_tensor_metadata


@register_patch("dynamo", "torch.Tensor.contiguous")
def _patch_contiguous_without_size_guard(original: Any) -> Any:
    """``x.contiguous()`` of a tensor whose contiguity depends on a dynamic size: a copy, without a guard.

    **Why**: ``contiguous()`` returns ``x`` itself when ``x`` is contiguous and a copy otherwise, so with symbolic
    sizes torch.export asks which, and records the answer as a guard on the sizes. A slice back to the unpadded
    size (``padded[:, :height, :width].contiguous()``: Swin's window layers after padding to the window, odd/even
    grids, pixel shuffles) is contiguous exactly when nothing was padded, so the guard is on the parity of the
    size (e11: ``Ne(32*Max(1, ((s4//4) + 1)//2), 16*(s4//4))``) and the program refused the other half of the
    sizes. The replacement keeps ``contiguous()`` where the sizes are static or the tensor is contiguous for every
    size (no guard either way) and otherwise copies (``clone(memory_format=torch.contiguous_format)``): the same
    values, a copy where eager may have skipped one.
    **Upstream**: pytorch/pytorch#185862 (``contiguous()`` of a sliced padded-stride tensor whose contiguity
    depends on a symbolic size); ``Tensor.contiguous`` evaluates ``is_contiguous`` with a guard on backed sizes
    (torch 2.15).
    **Remove when**: torch.export traces ``contiguous()`` of such a slice without a guard; the test traces a slice
    of a padded tensor at an odd size and runs it at an even one with
    ``disable=("_patch_contiguous_without_size_guard",)``.
    """

    @functools.wraps(original)
    def contiguous(self: torch.Tensor, memory_format: torch.memory_format = torch.contiguous_format) -> torch.Tensor:
        if (memory_format is not torch.contiguous_format or not _symbolic(*self.shape)
                or _statically_contiguous(self)):
            return original(self, memory_format=memory_format)
        return self.clone(memory_format=torch.contiguous_format)

    return contiguous
