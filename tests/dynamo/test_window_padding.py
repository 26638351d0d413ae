"""Dynamic spatial sizes padded to a multiple of a window and sliced back, without a guard on the size's parity
(hfexport_dynamo/_window_padding.py; issue 25, e11; the field cases s60 and s61 are its siblings)."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch.export import Dim

import hfexport


class PadRollSliceBack(torch.nn.Module):
    """Pad ``[b, h, w, c]`` to even sizes, roll, slice back: the slice is contiguous exactly when h and w are even."""

    def forward(self, x):
        b, h, w, c = x.shape
        padded = F.pad(x, (0, 0, 0, 2 * ((w + 1) // 2) - w, 0, 2 * ((h + 1) // 2) - h))
        y = padded.roll((1, 1), dims=(1, 2)) * 2.0
        return y[:, :h, :w, :].contiguous().view(b, h * w, c)


def run(model, traced, other, disable=(), shapes=None, **options):
    exported = hfexport.export(model, copy.deepcopy(traced), backend="dynamo", disable=disable,
                               dynamic_shapes=shapes, **options)
    with torch.no_grad():
        expected = model(**other)
    actual = exported(**copy.deepcopy(other))
    actual, expected = (getattr(v, "to_tuple", lambda v=v: (v,))() for v in (actual, expected))
    for a, e in zip(actual, expected, strict=True):
        torch.testing.assert_close(a, e, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("patch,width", [("_patch_layout_queries_without_size_guard", 7),
                                         ("_patch_contiguous_without_size_guard", 4)])
def test_a_slice_back_from_padding_keeps_both_parities(patch, width):
    """Traced at odd sizes, run at an even height (and width); either patch off, torch.export guards the parity.
    For the layout patch only the height is dynamic: ``_widen_narrowed_dims`` retraces with size-oblivious guards
    when the guards refuse an image-like input at twice its dims 2 on, which stands in for that patch on a dynamic
    width (not for the ``contiguous()`` one)."""
    model = PadRollSliceBack().eval()
    traced = {"x": torch.randn(2, 5, 7, 3, generator=torch.Generator().manual_seed(0))}
    other = {"x": torch.randn(2, 6, width, 3, generator=torch.Generator().manual_seed(1))}
    # explicit ranges: the solver cannot prove h <= 2*((h+1)//2)
    shapes = {"x": {1: Dim.DYNAMIC} if width == 7 else {1: Dim.DYNAMIC, 2: Dim.DYNAMIC}}
    run(model, traced, other, shapes=shapes)
    with pytest.raises(hfexport.ExportError, match="verification at a second shape.*Guard failed"):
        run(model, traced, other, disable=(patch,), shapes=shapes)


class PadSliceBackOps(torch.nn.Module):
    """Ops straight on the slice back from padding (no ``contiguous()`` first): an elementwise op, ``layer_norm``
    (its decomposition's own ``contiguous()``) and ``clone``; the slice is contiguous exactly when h and w are even."""

    def forward(self, x):
        b, h, w, c = x.shape
        padded = F.pad(x, (0, 0, 0, 2 * ((w + 1) // 2) - w, 0, 2 * ((h + 1) // 2) - h))
        y = padded[:, :h, :w, :]
        return y * 2.0 + x, F.layer_norm(y, (c,)), y.clone()


def test_ops_on_a_slice_back_from_padding_keep_both_parities():
    """Traced at odd sizes, run at even ones; with the layout-query patch off, the elementwise op's fast path (and
    layer_norm's and clone's layout) guards the parity."""
    model = PadSliceBackOps().eval()
    traced = {"x": torch.randn(2, 5, 7, 3, generator=torch.Generator().manual_seed(0))}
    other = {"x": torch.randn(2, 6, 7, 3, generator=torch.Generator().manual_seed(1))}
    shapes = {"x": {1: Dim.DYNAMIC}}  # the height only, as above
    run(model, traced, other, shapes=shapes)
    with pytest.raises(hfexport.ExportError, match="verification at a second shape.*Guard failed"):
        run(model, traced, other, disable=("_patch_layout_queries_without_size_guard",), shapes=shapes)


def tiny_swin(depths=(1, 1)):
    from transformers import SwinConfig, SwinModel

    torch.manual_seed(0)
    return SwinModel(SwinConfig(image_size=32, patch_size=4, embed_dim=8, depths=list(depths), num_heads=[1] * len(depths),
                                window_size=2, mlp_ratio=1.0, drop_path_rate=0.0)).eval()


@pytest.mark.slow  # 40-50 s each: the trace with the parity guards is slow; e11, s60, s61 cover the patched path
@pytest.mark.parametrize("patch,depths", [("_patch_window_padding_without_parity_guard", (1,)),
                                          ("_patch_patch_merging_pad_without_parity_guard", (1, 1))])
def test_swin_grid_of_the_other_parity(patch, depths):
    """A tiny Swin traced at 7x9 patches runs at 6x8 (the window padding, and the merging's padding of the odd
    grid, change parity); with the patch off the program guards the parity of the grid. One stage (no merging)
    where the window padding is tested: the trace with the parity guards takes minutes on two stages."""
    model = tiny_swin(depths)
    traced = {"pixel_values": torch.randn(1, 3, 28, 36, generator=torch.Generator().manual_seed(0))}
    other = {"pixel_values": torch.randn(1, 3, 24, 32, generator=torch.Generator().manual_seed(1))}
    # each stage's grid larger than window_size 2 (3 patches; 5 with the merging, whose grid is halved): at or
    # below it Swin takes its other branch (the window is the grid, no shift), which the program guards, and the
    # smallest-shape verification refused the range from 2 patches this test claimed before
    least = 3 if len(depths) == 1 else 5
    shapes = {"pixel_values": {2: 4 * Dim("h", min=least, max=16), 3: 4 * Dim("w", min=least, max=16)}}
    run(model, traced, other, shapes=shapes)
    with pytest.raises(hfexport.ExportError, match="verification at a second shape.*Guard failed"):
        run(model, traced, other, disable=(patch,), shapes=shapes)


def tiny_focalnet():
    from transformers import FocalNetConfig, FocalNetModel

    torch.manual_seed(0)
    return FocalNetModel(FocalNetConfig(image_size=32, patch_size=4, embed_dim=8, depths=[1, 1], focal_levels=[2, 2],
                                        focal_windows=[3, 3])).eval()


@pytest.mark.slow  # 8-17 s each (the trace with the guards); Swinv2, Donut-Swin and MaskFormer-Swin copy Swin's code
@pytest.mark.parametrize("build", [tiny_swin, tiny_focalnet])
def test_image_sizes_that_are_not_multiples_of_the_patch(build):
    """Traced at 30x37 pixels (not multiples of the patch, 4), run at 28x36 (multiples); with the patch off the
    program guards the divisibility (Swin: ``w % 4 != 0``; FocalNet, whose downsampling pads to a multiple of 2: the
    parity of the patch grid). The export's own second shape (31x38) keeps the traced remainders, so the run
    after it is what fails."""
    model = build()
    traced = {"pixel_values": torch.randn(1, 3, 30, 37, generator=torch.Generator().manual_seed(0))}
    other = {"pixel_values": torch.randn(1, 3, 28, 36, generator=torch.Generator().manual_seed(1))}
    shapes = {"pixel_values": {2: Dim("h", min=8, max=64), 3: Dim("w", min=8, max=64)}}
    run(model, traced, other, shapes=shapes)
    with pytest.raises(Exception, match="Guard failed"):
        run(model, traced, other, disable=("_patch_patch_embeddings_pad_without_divisibility_guard",), shapes=shapes)


def test_static_sizes_keep_the_original_code():
    """Without dynamic sizes the patches change nothing: the padded-and-sliced layer is traced as before."""
    model = tiny_swin()
    inputs = {"pixel_values": torch.randn(1, 3, 28, 36, generator=torch.Generator().manual_seed(0))}
    with_patches = hfexport.export(model, copy.deepcopy(inputs), backend="dynamo")
    without = hfexport.export(model, copy.deepcopy(inputs), backend="dynamo", disable=(
        "_patch_window_padding_without_parity_guard", "_patch_patch_merging_pad_without_parity_guard",
        "_patch_contiguous_without_size_guard", "_patch_layout_queries_without_size_guard",
        "_patch_patch_embeddings_pad_without_divisibility_guard"))
    ops = [[str(n.target) for n in e.components["model"].runner.program.graph.nodes if n.op == "call_function"]
           for e in (with_patches, without)]
    assert ops[0] == ops[1]


def test_every_patch_names_why_upstream_and_when_it_can_go():
    """Each patch of the module is listed (``hfexport workarounds``), in the dynamo scope, with Why/Upstream/Remove
    when and an upstream issue or the model-side change it waits for; each is disabled by a test above."""
    import re

    import hfexport_dynamo._window_padding as module

    patches = [r for r in hfexport.list_workarounds() if r.module == module.__name__]
    assert {r.name for r in patches} == {
        "_patch_window_padding_without_parity_guard", "_patch_patch_merging_pad_without_parity_guard",
        "_patch_patch_embeddings_pad_without_divisibility_guard", "_patch_contiguous_without_size_guard",
        "_patch_layout_queries_without_size_guard", "_patch_tf_same_padding_without_size_guard"}
    for registration in patches:
        assert registration.kind == "patch", registration.name
        # torch's layout queries: for the trace only (its own scope); the others for the whole export
        expected = "dynamo.trace" if registration.name == "_patch_layout_queries_without_size_guard" else "dynamo"
        assert registration.scope == expected, registration.name
        doc = registration.func.__doc__
        for part in ("**Why**", "**Upstream**", "**Remove when**"):
            assert part in doc, (registration.name, part)
        assert re.search(r"[\w-]+/[\w-]+#\d+|huggingface/transformers", doc), registration.name
        assert f'disable=("{registration.name}",)' in doc, registration.name  # how its test shows the failure


def test_the_layout_query_patch_is_installed_for_the_trace_only():
    """Installed by capture's stage 2 and restored when ``torch.export.export`` returns: a backend's lowering (its
    retraces, its fixes' fake metadata) runs torch's own queries; the lowering needs no guard-free answer (e11, s60
    and s61 pass on every backend)."""
    import torch._prims_common as prims

    seen = []

    def progress(event):
        patched = hasattr(prims.check_contiguous_sizes_strides, "__wrapped__")
        seen.append((event.backend, event.stage.number if event.stage else event.step, event.status, patched))

    hfexport.export(torch.nn.Linear(3, 2), {"input": torch.ones(2, 3)}, backend="onnx", progress=progress)
    assert ("dynamo", 5, "start", True) in seen
    assert ("onnx", 3, "start", False) in seen
    assert not hasattr(prims.check_contiguous_sizes_strides, "__wrapped__")
