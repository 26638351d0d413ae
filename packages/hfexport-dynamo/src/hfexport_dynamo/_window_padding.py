"""Patches (stage 2, ``"dynamo"`` scope) that pad a dynamic size to a multiple of a window, and slice back,
without asking torch.export the parity of the size: three for shifted-window vision models (Swin and the families
that copy its layers, FocalNet's patch embeddings), one for MobileNet's TensorFlow-style "SAME" padding, two for torch
itself (``contiguous()`` of such a slice, and the layout queries that
elementwise ops, ``layer_norm``, ``clone`` and each node's ``tensor_meta`` make on it), which every model that pads
and slices back needs (odd/even grids, pixel shuffles). The layout queries' patch has the scope ``"dynamo.trace"``:
installed for ``torch.export.export`` only, not for the backend's lowering (its retraces and fixes run torch's own).

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


# The patch embeddings that pad the image to a multiple of the patch size only when it is not one (Swin's, and the
# copies in Swinv2, Donut-Swin, MaskFormer-Swin; FocalNet's, which also downsamples between its stages).
_PATCH_EMBEDDINGS = (
    "swin.modeling_swin.SwinPatchEmbeddings",
    "swinv2.modeling_swinv2.Swinv2PatchEmbeddings",
    "donut.modeling_donut_swin.DonutSwinPatchEmbeddings",
    "maskformer.modeling_maskformer_swin.MaskFormerSwinPatchEmbeddings",
    "focalnet.modeling_focalnet.FocalNetPatchEmbeddings",
)


@register_patch("dynamo", *(f"transformers.models.{path}.maybe_pad" for path in _PATCH_EMBEDDINGS))
def _patch_patch_embeddings_pad_without_divisibility_guard(original: Any) -> Any:
    """A patch embedding's padding of the image to a multiple of the patch size, done for every size.

    **Why**: ``SwinPatchEmbeddings.maybe_pad`` pads ``[batch, channels, height, width]`` to multiples of the patch
    only ``if width % patch != 0`` (and the same for the height): with a dynamic image size torch.export records a
    guard on the size's divisibility and the program refuses the other sizes (a tiny Swin traced at 30x37 pixels
    failed at 28x36 with "Guard failed: pixel_values.size()[3] % 4 != 0"). FocalNet pads the same way before each
    downsampling, where the patch is 2, so its program was specialized to the parity of the patch grid ("Guard
    failed: (1 + (w + -1 * (w % 4)) // 4) % 2 == 0"). The replacement pads by ``patch * ceil(size / patch) - size``
    every time (a pad of 0 is the identity), the same values without the branch. Static sizes keep the original.
    **Upstream**: huggingface/transformers, the ``if width % self.patch_size[1] != 0`` branches of
    ``SwinPatchEmbeddings.maybe_pad`` and its copies (Swinv2, Donut-Swin, MaskFormer-Swin) and of
    ``FocalNetPatchEmbeddings.maybe_pad``; pytorch/pytorch#136216 (open) asks torch.export to see through such
    ``if pad > 0`` padding.
    **Remove when**: the embeddings pad unconditionally; the test exports a tiny Swin and a tiny FocalNet at
    sizes that are not multiples of the patch and runs them at multiples with
    ``disable=("_patch_patch_embeddings_pad_without_divisibility_guard",)``.
    """

    @functools.wraps(original)
    def maybe_pad(self: Any, pixel_values: torch.Tensor, height: Any, width: Any) -> torch.Tensor:
        if not _symbolic(height, width):
            return original(self, pixel_values, height, width)
        patch_height, patch_width = self.patch_size
        pad_right = patch_width * ((width + patch_width - 1) // patch_width) - width
        pad_bottom = patch_height * ((height + patch_height - 1) // patch_height) - height
        return F.pad(pixel_values, (0, pad_right, 0, pad_bottom))

    return maybe_pad


def _same_padding(size: Any, stride: int, kernel: int) -> Any:
    """TensorFlow's "SAME" padding along one dim, one formula for both of its cases: ``kernel - stride`` where
    ``stride`` divides ``size``, else ``kernel - size % stride`` (both at least 0); ``(-size) % stride`` is 0 in the
    first case and ``stride - size % stride`` in the second."""
    pad = kernel - stride + (-size) % stride
    return pad if kernel >= stride else torch.sym_max(pad, 0)


@register_patch("dynamo", *(f"transformers.models.{family}.modeling_{family}.apply_tf_padding"
                            for family in ("mobilenet_v1", "mobilenet_v2")))
def _patch_tf_same_padding_without_size_guard(original: Any) -> Any:
    """MobileNet's TensorFlow-style "SAME" padding computed from the symbolic image size.

    **Why**: ``apply_tf_padding`` (MobileNetV1 and V2, ``config.tf_padding=True``, the default) reads the size as
    ``int(features.shape[-2])`` (V2) and branches on ``in_height % stride == 0`` (both), so torch.export fixed the
    image's height and width to the traced ones: the MobileNetV2 of Transformers' model tester, traced at 32x32,
    refused 64x64 on every backend ("dim 2 is static (32)", guard ``Eq(pixel_values.size(2), 32)`` at
    ``modeling_mobilenet_v2.py:56``). The replacement computes the same pads with one formula
    (:func:`_same_padding`), symbolic where the size is. Static sizes keep the original.
    **Upstream**: model-side (huggingface/transformers ``models/mobilenet_v2/modeling_mobilenet_v2.py`` and
    ``models/mobilenet_v1/modeling_mobilenet_v1.py``, ``apply_tf_padding``).
    **Remove when**: ``apply_tf_padding`` keeps the size symbolic and pads without the branch; the test exports a
    tiny MobileNetV2 at 32x32 and runs it at 33x48 and 64x64 with
    ``disable=("_patch_tf_same_padding_without_size_guard",)``.
    """

    @functools.wraps(original)
    def apply_tf_padding(features: torch.Tensor, conv_layer: Any) -> torch.Tensor:
        height, width = features.shape[-2:]
        if not _symbolic(height, width):
            return original(features, conv_layer)
        (stride_height, stride_width), (kernel_height, kernel_width) = conv_layer.stride, conv_layer.kernel_size
        dilation_height, dilation_width = conv_layer.dilation
        along_height = _same_padding(height, stride_height, kernel_height)
        along_width = _same_padding(width, stride_width, kernel_width)
        top, left = along_height // 2, along_width // 2
        padding = (left * dilation_width, (along_width - left) * dilation_width,
                   top * dilation_height, (along_height - top) * dilation_height)
        return F.pad(features, padding, "constant", 0.0)

    return apply_tf_padding


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



@register_patch("dynamo.trace", "torch._prims_common.check_contiguous_sizes_strides")
def _patch_layout_queries_without_size_guard(original: Any) -> Any:
    """torch's layout queries meant not to guard (``is_contiguous_or_false``, ...): no guard on a dynamic size.

    **Why**: an elementwise op's output layout, ``layer_norm``'s and ``clone``'s, each node's ``tensor_meta`` end in
    ``check_contiguous_sizes_strides(..., false_if_dde=True)``, which guards a backed size: a slice back from padding
    guarded its parity (e11) and the program refused the other half of the sizes. Evaluated as for unbacked sizes
    (``backed_size_oblivious``): the general path, the same values. Trace only (scope ``dynamo.trace``).
    **Upstream**: pytorch/pytorch#123592 (pytorch/pytorch#185084 removed only the size-1 part of it).
    **Remove when**: the tests trace such a slice at an odd size, run it at an even one and pass with
    ``disable=("_patch_layout_queries_without_size_guard",)``.
    """
    from torch.fx.experimental import _config as shape_config

    @functools.wraps(original)
    def check_contiguous_sizes_strides(sizes: Any, strides: Any, false_if_dde: bool = False) -> bool:
        if false_if_dde and _symbolic(*sizes, *strides):
            with shape_config.patch(backed_size_oblivious=True):  # guard_or_*: the static answer, else the default
                return original(sizes, strides, false_if_dde=True)
        return original(sizes, strides, false_if_dde=false_if_dde)

    return check_contiguous_sizes_strides
