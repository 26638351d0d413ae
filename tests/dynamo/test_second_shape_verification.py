"""The export's verification runs a second shape, each dynamic size moved by one within its range, so that a
program specialized by a guard on the sizes (their parity) fails at export time (issue 25, e11's kind)."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

import hfexport


class PadIfOdd(torch.nn.Module):
    """Pads to an even length only ``if`` it is odd (the Swin pattern, unpatched): the trace keeps one branch."""

    def forward(self, x):  # [b, n]
        n = x.shape[1]
        pad = (2 - n % 2) % 2
        if pad > 0:
            x = F.pad(x, (0, pad))
        return x.view(x.shape[0], -1, 2).sum(-1)


class Plain(torch.nn.Module):
    def forward(self, x):
        return (x * 2.0).cumsum(-1)


def test_a_parity_guard_fails_the_export():
    x = torch.randn(2, 7, generator=torch.Generator().manual_seed(0))
    with pytest.raises(hfexport.ExportError, match=r"verification at a second shape \(x=\[3, 8\]\)") as caught:
        hfexport.export(PadIfOdd().eval(), {"x": x}, backend="dynamo", dynamic=True)
    assert "Guard failed" in str(caught.value)
    kept = hfexport.export(PadIfOdd().eval(), {"x": x}, backend="dynamo", dynamic=True, verify=False)
    second = kept.manifest["verification"]["second_shape"]
    assert second["passed"] is False and "Guard failed" in second["error"], second


@pytest.mark.parametrize("backend", ["dynamo", "onnx"])
def test_the_second_shape_is_recorded(backend):
    x = torch.randn(2, 7, generator=torch.Generator().manual_seed(0))
    exported = hfexport.export(Plain().eval(), {"x": copy.deepcopy(x)}, backend=backend, dynamic=True)
    second = exported.manifest["verification"]["second_shape"]
    assert second["passed"] is True and second["inputs"] == {"x": [3, 8]}, second
    assert exported.manifest["verification"]["inputs"] == {"x": [2, 7]}  # the traced shape's report stays
    static = hfexport.export(Plain().eval(), {"x": x}, backend=backend)
    assert "second_shape" not in static.manifest["verification"]


class PerImage(torch.nn.Module):
    """Encodes each image apart by a Python ``list()`` over the images (LLaVA's ``get_image_features`` before
    ``_patch_llava_image_features_stay_batched``): the trace unrolls the loop for the traced count."""

    def forward(self, pixel_values):  # [images, c, n]
        return torch.cat([f.flatten() * (i + 1) for i, f in enumerate(list(pixel_values))])


def test_a_count_fixed_at_trace_time_is_refused_at_export():
    """Images in [1, 2], traced at 2: the move by one has nowhere to go (3 is past the range, 1 below the parity
    check's floor), so only the smallest shape (1 image) catches the unrolled loop; the artifact that would fail
    at one image is refused at export, and kept with verify=False, its manifest saying why."""
    x = torch.randn(2, 3, 4, generator=torch.Generator().manual_seed(0))
    dims = {"pixel_values": {0: torch.export.Dim("images", min=1, max=2)}}
    with pytest.raises(hfexport.ExportError, match=r"verification at the smallest shape \(pixel_values=\[1, 3, 4\]\)"
                       ) as caught:
        hfexport.export(PerImage().eval(), {"pixel_values": x}, backend="dynamo", dynamic_shapes=dims)
    assert "list() or unbind over images" in str(caught.value)
    kept = hfexport.export(PerImage().eval(), {"pixel_values": x}, backend="dynamo", dynamic_shapes=dims,
                           verify=False)
    verification = kept.manifest["verification"]
    assert verification["smallest_shape"] == {"passed": False, "error": "IndexError: list index out of range",
                                              "inputs": {"pixel_values": [1, 3, 4]}}, verification
    assert verification["second_shape"]["passed"] is None
    assert "no dynamic size can move by one" in verification["second_shape"]["skipped"]


@pytest.mark.parametrize("backend", ["dynamo", "onnx"])
def test_the_smallest_shape_is_checked_below_the_example(backend):
    """``dynamic=True`` ranges start at 2 (torch.export's 0/1 specialization): each size goes down to 2."""
    x = torch.randn(3, 7, generator=torch.Generator().manual_seed(0))
    exported = hfexport.export(Plain().eval(), {"x": x}, backend=backend, dynamic=True)
    smallest = exported.manifest["verification"]["smallest_shape"]
    assert smallest["passed"] is True and smallest["inputs"] == {"x": [2, 2]}, smallest


def siglip_tower() -> torch.nn.Module:
    """A seeded SigLIP vision tower of 4-pixel patches trained at 24x24 (36 positions), run without
    ``interpolate_pos_encoding``: its position table is added to the patches as they are."""
    import transformers as tf

    torch.manual_seed(0)
    return tf.SiglipVisionModel(tf.SiglipVisionConfig(hidden_size=24, num_hidden_layers=1, num_attention_heads=2,
                                                      intermediate_size=40, image_size=24, patch_size=4,
                                                      vision_use_head=False)).eval()


def test_image_dims_pinned_by_a_position_table_get_the_range_the_guards_admit():
    """``dynamic=True`` on a tower whose position table pins the patch count (``(h // 4) * (w // 4) == 36``, which
    no range says): torch.export left the image dims dynamic from 4 up, and the export's verification at 4x4 (one
    patch, which eager broadcasts over the 36 positions) failed on the program's guard (dynamo) or in ORT's fused
    MultiHeadAttention (onnx). The dims now claim [24, 27], the sizes the guards admit, and the export verifies."""
    x = torch.randn(2, 3, 24, 24, generator=torch.Generator().manual_seed(0))
    exported = hfexport.export(siglip_tower(), {"pixel_values": x}, backend="dynamo", dynamic=True)
    dims = exported.manifest["inputs"][0]["dynamic_dims"]
    assert [(dims[d]["min"], dims[d]["max"]) for d in ("2", "3")] == [(24, 27), (24, 27)], dims
    assert dims["0"]["max"] is None, dims  # the batch: no pin reads it
    verification = exported.manifest["verification"]
    assert verification["second_shape"]["passed"] is True, verification  # 3x3x25x25: still 6x6 patches
    assert verification["smallest_shape"]["passed"] is None, verification  # the example is the least: no 4x4
    assert any("a guard of the trace pins" in note and "dim 3 from [4, inf] to [24, 27]" in note
               for note in exported.manifest["notes"]), exported.manifest["notes"]
