"""Issue 28 ("vision traced"): dynamo model patches that let a multimodal zoo case of the seeded sample export with
its media inputs. Each test exports the case with its image, checks the program against eager at the zoo's second
shape (the sweep's criterion), and shows the failure again with the patch disabled."""

from __future__ import annotations

import pytest
import torch

import hfexport
from hfexport import ExportError

ATOL, RTOL = 1e-4, 1e-3  # the sweep's criterion


def _first_rows(inputs: dict, rows: int) -> dict:
    """The zoo's inputs cut to their first ``rows`` text rows (the media belong to the first row), to keep the
    exports fast."""
    from hfexport_dynamo.inputs import TOKEN_INPUTS

    return {k: v[:rows] if k in TOKEN_INPUTS and isinstance(v, torch.Tensor) else v for k, v in inputs.items()}


@pytest.mark.slow  # two exports of the zoo's tiny Apertus 1.5 with its image; about 25 s on a loaded 2-core machine
def test_apertus_1_5_tokenizes_its_image_at_the_baked_sizes():
    from hfexport_sweep import zoo

    model, inputs, alt_inputs = zoo.build_case("apertus1p5/Apertus1p5Model")
    media = zoo.image_inputs(model)
    assert media.kind == "image_sizes" and media.tokens_per_image == 16, media  # a 64-pixel image's 4 x 4 codes
    inputs, alt_inputs = _first_rows(inputs, 2), _first_rows(alt_inputs, 3)
    patch = "_patch_apertus1p5_image_size_list"
    exported = hfexport.export(model, inputs, backend="dynamo", dynamic=True)
    assert patch in str(exported.manifest["workarounds"]["patches"])
    assert exported.manifest["fixed_kwargs"]["image_sizes"] == [[64, 64]]
    report = exported.verify(alt_inputs, atol=ATOL, rtol=RTOL)
    assert report.passed, str(report)
    with pytest.raises(ExportError, match="'list' object has no attribute 'tolist'"):
        hfexport.export(model, inputs, backend="dynamo", dynamic=True, disable=(patch,))


@pytest.mark.slow  # two exports of the zoo's tiny ERNIE 4.5 VL with its image; about 60 s on a loaded 2-core machine
def test_ernie_4_5_vl_pairs_its_frames_with_index_tensors():
    from hfexport_sweep import zoo

    model, inputs, alt_inputs = zoo.build_case("ernie4_5_vl_moe/Ernie4_5_VLMoeModel")
    assert zoo.image_inputs(model).kind == "image_grid_thw"
    # 4 and 5 rows: the M-RoPE position_ids [3, batch, seq] keep their 3 apart from the batch
    inputs, alt_inputs = _first_rows(inputs, 4), _first_rows(alt_inputs, 5)
    for x in (inputs, alt_inputs):
        x["position_ids"] = x["position_ids"][:, :x["input_ids"].shape[0]]
    patch = "_patch_ernie4_5_vl_temporal_slicing"
    exported = hfexport.export(model, inputs, backend="dynamo", dynamic=True)
    assert patch in str(exported.manifest["workarounds"]["patches"])
    report = exported.verify(alt_inputs, atol=ATOL, rtol=RTOL)
    assert report.passed, str(report)
    with pytest.raises(ExportError, match="data-dependent expression"):
        hfexport.export(model, inputs, backend="dynamo", dynamic=True, disable=(patch,))


@pytest.mark.parametrize("grid", [[[1, 4, 4]], [[2, 4, 4]], [[1, 4, 4], [4, 2, 4], [3, 4, 2], [1, 2, 2]]])
def test_ernie_4_5_vl_frame_pairs_are_the_loops(grid):
    """The patch's rows equal the original loops' for an image, a video and a batch of images and videos of even
    and odd frame counts (an odd video's last frame has no partner)."""
    from transformers.models.ernie4_5_vl_moe import modeling_ernie4_5_vl_moe as ernie

    from hfexport_dynamo._model_patches import _patch_ernie4_5_vl_temporal_slicing

    original = ernie.Ernie4_5_VLMoeVariableResolutionResamplerModel._temporal_slicing
    patched = _patch_ernie4_5_vl_temporal_slicing(original)

    class Resampler:
        spatial_merge_size = 2

    grid_thw = torch.tensor(grid)
    hidden_states = torch.randn(int((grid_thw.prod(-1) // 4).sum()), 5, generator=torch.Generator().manual_seed(0))
    assert torch.equal(patched(Resampler(), hidden_states, grid_thw), original(Resampler(), hidden_states, grid_thw))
