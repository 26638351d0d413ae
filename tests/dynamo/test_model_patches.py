"""The single-family model patches of ``hfexport_dynamo._model_patches``: each class was an ``EXPORT_SKIPS`` entry;
with its patch it exports with a dynamic sequence and matches eager at two other sequence lengths, and without it
(``disable=(...)``) the failure the entry recorded comes back (what makes each workaround re-checkable)."""

from __future__ import annotations

import pytest
import torch

import hfexport
from hfexport import ExportError
from hfexport_dynamo import EXPORT_SKIPS

ATOL, RTOL = 1e-4, 1e-3  # the sweep's criterion


def zoo_model(case_id: str) -> torch.nn.Module:
    from hfexport_sweep.zoo import build_case

    return build_case(case_id)[0]


def token_inputs(model: torch.nn.Module, batch: int, seq: int, decoder_seq: int | None = None) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(batch * 100 + seq)
    ids = torch.randint(0, model.config.vocab_size, (batch, seq), generator=generator)
    inputs = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    if decoder_seq is not None:
        decoder = torch.randint(0, model.config.vocab_size, (batch, decoder_seq), generator=generator)
        inputs.update(decoder_input_ids=decoder, decoder_attention_mask=torch.ones_like(decoder))
    return inputs


def assert_exports_only_with(model, inputs, alt_inputs, patch: str, failure: str) -> None:
    """Exported with ``dynamic=True``, the program records ``patch`` and matches eager at ``alt_inputs`` (the
    sweep's criterion); with ``patch`` disabled the export fails matching ``failure``."""
    exported = hfexport.export(model, inputs, dynamic=True)
    assert patch in str(exported.manifest["workarounds"]["patches"])
    report = exported.verify(alt_inputs, atol=ATOL, rtol=RTOL)
    assert report.passed, str(report)
    with pytest.raises(ExportError, match=failure):
        hfexport.export(model, inputs, dynamic=True, disable=(patch,))


@pytest.mark.slow  # two exports of the zoo's tiny CPM-Ant; about 20 s on an idle 2-core machine
def test_cpmant_exports_with_a_dynamic_sequence_and_without_the_patch_specializes_it():
    model = zoo_model("cpmant/CpmAntForCausalLM")
    assert "CpmAntForCausalLM" not in EXPORT_SKIPS and "CpmAntModel" not in EXPORT_SKIPS
    exported = hfexport.export(model, token_inputs(model, 2, 8), dynamic=True)
    assert "_patch_cpmant_left_padding_mask" in str(exported.manifest["workarounds"]["patches"])
    for batch, seq in ((3, 12), (1, 5)):
        report = exported.verify(token_inputs(model, batch, seq), atol=ATOL, rtol=RTOL)
        assert report.passed, str(report)

    without = hfexport.export(model, token_inputs(model, 2, 8), dynamic=True,
                              disable=("_patch_cpmant_left_padding_mask",))
    with pytest.raises(ValueError, match=r"has size 12 in dim 1 .*dim 1 is static \(8\)"):
        without(**token_inputs(model, 3, 12))  # the sequence was specialized to the traced 8


@pytest.mark.slow  # three exports of the zoo's tiny Switch Transformers; about 30 s on an idle 2-core machine
def test_switch_transformers_export_with_the_router_cast_skipped_and_the_experts_run_dense():
    model = zoo_model("switch_transformers/SwitchTransformersForConditionalGeneration")
    assert "SwitchTransformersForConditionalGeneration" not in EXPORT_SKIPS
    exported = hfexport.export(model, token_inputs(model, 2, 8, 6), dynamic=True)
    patches = str(exported.manifest["workarounds"]["patches"])
    assert "_patch_switch_router_cast" in patches and "_patch_switch_experts_dense" in patches
    for batch, seq, decoder_seq in ((3, 12, 5), (1, 5, 9)):
        report = exported.verify(token_inputs(model, batch, seq, decoder_seq), atol=ATOL, rtol=RTOL)
        assert report.passed, str(report)
    assert all(not m.training for m in model.modules())  # the model is left as it was: eval mode, no patch left
    from transformers.models.switch_transformers import modeling_switch_transformers as switch

    for cls in (switch.SwitchTransformersTop1Router, switch.SwitchTransformersExperts):
        assert cls.forward.__module__ == switch.__name__  # the patches were reverted

    with pytest.raises(ExportError, match="(?i)swap"):  # the in-forward cast of the classifier
        hfexport.export(model, token_inputs(model, 2, 8, 6), dynamic=True, disable=("_patch_switch_router_cast",))
    with pytest.raises(ExportError, match="(?i)data.dependent|GuardOnDataDependentSymNode|nonzero"):
        hfexport.export(model, token_inputs(model, 2, 8, 6), dynamic=True, disable=("_patch_switch_experts_dense",))


def test_the_switch_router_patch_refuses_a_classifier_in_another_dtype_than_the_router():
    from transformers import SwitchTransformersConfig
    from transformers.models.switch_transformers.modeling_switch_transformers import (
        SwitchTransformersTop1Router,
    )

    from hfexport_dynamo._model_patches import _patch_switch_router_cast

    config = SwitchTransformersConfig(d_model=8, num_experts=2, expert_capacity=4, router_dtype="float32")
    router = SwitchTransformersTop1Router(config).eval()
    forward = _patch_switch_router_cast(SwitchTransformersTop1Router.forward)
    hidden = torch.randn(1, 3, 8)
    expected = SwitchTransformersTop1Router.forward(router, hidden)
    for got, want in zip(forward(router, hidden), expected, strict=True):
        assert torch.equal(got, want)
    router.classifier.to(torch.float64)
    with pytest.raises(TypeError, match=r"classifier is torch.float64 but the router runs in torch.float32"):
        forward(router, hidden)


@pytest.mark.slow  # four exports of the zoo's tiny SEW and SEW-D; about 40 s on an idle 2-core machine
@pytest.mark.parametrize("case_id, patches", [
    ("sew/SEWForCTC", ("_patch_sew_encoder_lengths",)),
    ("sew-d/SEWDModel", ("_patch_sewd_encoder_lengths",)),
])
def test_sew_encoders_export_for_odd_and_even_frame_counts(case_id, patches):
    model = zoo_model(case_id)
    assert type(model).__name__ not in EXPORT_SKIPS

    def audio(samples: int, batch: int = 3) -> dict[str, torch.Tensor]:
        return {"input_values": torch.randn(batch, samples, generator=torch.Generator().manual_seed(samples))}

    exported = hfexport.export(model, audio(1600, batch=2), dynamic=True)  # 5 frames (odd: one padded frame)
    assert all(p in str(exported.manifest["workarounds"]["patches"]) for p in patches)
    for samples in (1850, 2240, 3333):  # 5, 6 and 10 frames: a pad of 1 frame and of none
        report = exported.verify(audio(samples), atol=ATOL, rtol=RTOL)
        assert report.passed, str(report)

    without = hfexport.export(model, audio(1600, batch=2), dynamic=True, disable=patches)
    with pytest.raises(AssertionError, match="Guard failed"):  # the frame count's parity was specialized
        without(**audio(1850))


def test_vit_mae_dummy_inputs_fix_its_random_masking_so_the_export_matches_eager():
    """ViTMAE draws its patch mask with torch.rand inside forward unless ``noise`` is given: the dummy inputs give
    it (the sweep's vit_mae mismatch: ids_restore differed by up to 60)."""
    from transformers import ViTMAEConfig, ViTMAEModel

    from hfexport_dynamo import dummy_inputs

    torch.manual_seed(0)
    model = ViTMAEModel(ViTMAEConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                     intermediate_size=64, image_size=32, patch_size=8)).eval()
    inputs = dummy_inputs(model, batch=2)
    assert inputs["noise"].shape == (2, 16) and inputs["noise"].dtype == torch.float32  # (32 / 8) ** 2 patches
    exported = hfexport.export(model, inputs, dynamic=True)
    report = exported.verify(dummy_inputs(model, batch=3, seed=1), atol=ATOL, rtol=RTOL)
    assert report.passed, str(report)
    assert torch.equal(exported(**inputs).ids_restore, model(**inputs).ids_restore)


def fnet_inputs(model: torch.nn.Module, batch: int, seq: int) -> dict[str, torch.Tensor]:
    ids = token_inputs(model, batch, seq)["input_ids"]
    return {"input_ids": ids, "token_type_ids": torch.zeros_like(ids)}


@pytest.mark.slow  # three exports of the zoo's tiny FNet; about 40 s on an idle 2-core machine
def test_fnet_exports_to_onnx_with_its_fourier_transform_as_real_matmuls():
    model = zoo_model("fnet/FNetModel")
    exported = hfexport.export(model, fnet_inputs(model, 2, 8), backend="onnx", dynamic=True)
    assert "_patch_fnet_fourier_transform" in str(exported.manifest["workarounds"]["patches"])
    for batch, seq in ((3, 12), (1, 5)):
        report = exported.verify(fnet_inputs(model, batch, seq), atol=ATOL, rtol=RTOL)
        assert report.passed, str(report)

    # the .pt2 program keeps torch.fft (the patch is registered for the backends without complex tensors only)
    pt2 = hfexport.export(model, fnet_inputs(model, 2, 8), backend="dynamo", dynamic=True)
    assert "_patch_fnet_fourier_transform" not in str(pt2.manifest["workarounds"]["patches"])

    with pytest.raises(ExportError, match=r"ComplexRewriteError: aten\.fft_fftn"):
        hfexport.export(model, fnet_inputs(model, 2, 8), backend="onnx", dynamic=True,
                        disable=("_patch_fnet_fourier_transform",))


class BiasAboveThreshold(torch.nn.Module):
    """s52: an input ``[6]`` masked by a larger mask ``[rows, 6]`` (``masked_select`` broadcasts the input)."""

    def __init__(self):
        super().__init__()
        self.bias = torch.nn.Parameter(torch.linspace(-1.0, 1.0, 6))

    def forward(self, x):
        return self.bias.masked_select(x > 0.5)


def test_masked_select_of_a_broadcast_input_is_bounded_by_the_broadcast_numel():
    x = torch.tensor([[0.9, 0.1, 0.7, 0.2, 0.8, 0.6], [0.6, 0.9, 0.1, 0.1, 0.7, 0.2]])  # 8 of 12 kept, > numel 6
    model = BiasAboveThreshold().eval()
    # torch bounds the unbacked length by the input's numel (6): the .pt2's own runtime assertion fails
    with pytest.raises(ExportError, match=r"Runtime assertion failed for expression u\d+ <= 6"):
        hfexport.export(model, {"x": x}, backend="dynamo", disable=("_patch_masked_select",))
    exported = hfexport.export(model, {"x": x}, backend="dynamo")
    torch.testing.assert_close(exported(x=x), model(x))


@pytest.mark.slow  # two exports each of the zoo's tiny PaddleOCR-VL, GLM-OCR, HunYuan-VL (twice), Cosmos3-Edge,
# HY-V4-VL, Kimi-K2.5, VideoLLaMA3, MuseGlimmer, Muse Spark, Qwen2.5-Omni's thinker and EXAONE 4.5 with an image;
# about 15 s a case (EXAONE 4.5: 40 s)
@pytest.mark.parametrize("case_id, patch", [
    ("paddleocr_vl/PaddleOCRVLModel", "_patch_separate_projection_vision_segments"),
    ("glm_ocr/GlmOcrModel", "_patch_qwen_vl_vision_segments"),  # the Qwen-VL form with q_norm / k_norm
    ("hunyuan_vl/HunYuanVLModel", "_patch_hunyuan_vl_vision_segments"),  # batch-first, no rotary
    ("hunyuan_vl/HunYuanVLModel", "_patch_hunyuan_vl_placeholder_check"),  # the next guard: its placeholder count
    ("cosmos3_edge/Cosmos3EdgeModel", "_patch_cosmos3_edge_vision_segments"),  # no rotary, self.scale
    # HunYuan-VL's attention, and a position grid interpolated at a scale of the data-dependent grid size
    ("hy_v4_vl/HYV4VLModel", "_patch_hy_v4_vl_position_interpolation"),
    ("kimi_k25/Kimi_K25Model", "_patch_kimi_k25_merge_index_counts"),  # int() of its patch counts
    # the attention of PaddleOCR-VL, then a per-image view and interpolation at sizes of grid_thw
    ("video_llama_3/VideoLlama3Model", "_patch_video_llama_3_pixel_unshuffle"),
    ("muse_glimmer/MuseGlimmerModel", "_patch_muse_glimmer_vision_segments"),  # rotary batch-first, windows
    ("muse_spark/MuseSparkModel", "_patch_muse_glimmer_vision_segments"),  # MuseGlimmer's attention, copied
    ("qwen2_5_omni_thinker/Qwen2_5OmniThinkerModel", "_patch_qwen2_5_omni_vision_segments"),  # q, k, v; windows
    ("exaone4_5/Exaone4_5_Model", "_patch_exaone4_5_vision_segments"),  # fused qkv, fewer key/value heads
])
def test_vision_attention_over_packed_images_exports_with_one_segment_mask(case_id, patch):
    """The zoo's inputs carry packed image patches (``image_grid_thw``); the per-image split on
    ``.tolist()`` is data-dependent without the patch, and the exported program matches eager at the zoo's second
    shape with it."""
    from hfexport_sweep.zoo import build_case

    model, inputs, alt_inputs = build_case(case_id)
    assert "pixel_values" in inputs and "image_grid_thw" in inputs
    assert_exports_only_with(model, inputs, alt_inputs, patch, "(?i)data.dependent|GuardOnDataDependentSymNode")


@pytest.mark.slow  # two exports of the zoo's tiny Ovis2 with an image; about 10 s
def test_ovis2_writes_its_visual_indicator_embeddings_without_a_data_dependent_branch():
    """With the zoo's image the indicator loop's ``if mask.any()`` is data-dependent without the patch; with it the
    exported program matches eager at the zoo's second shape, and the patched forward writes the indicator tokens'
    embeddings as the original does."""
    from transformers.models.ovis2.modeling_ovis2 import Ovis2Model

    from hfexport_dynamo._model_patches import _patch_ovis2_visual_indicators
    from hfexport_sweep.zoo import build_case, image_inputs

    model, inputs, alt_inputs = build_case("ovis2/Ovis2Model")
    assert image_inputs(model).used and "pixel_values" in inputs
    with_indicators = {**inputs, "input_ids": inputs["input_ids"].clone()}
    with_indicators["input_ids"][1, :len(model.visual_indicator_token_ids)] = torch.tensor(
        model.visual_indicator_token_ids)
    with torch.no_grad():
        patched = _patch_ovis2_visual_indicators(Ovis2Model.forward)(model, **with_indicators)
        torch.testing.assert_close(patched.last_hidden_state, model(**with_indicators).last_hidden_state,
                                   atol=0, rtol=0)
    assert_exports_only_with(model, inputs, alt_inputs, "_patch_ovis2_visual_indicators",
                             "(?i)data.dependent|GuardOnDataDependentSymNode")


def test_hy_v4_vl_position_grid_sampled_in_tensor_ops_equals_its_interpolation():
    """The patched patch embedding (bilinear sampling by gathers) gives eager's ``F.interpolate`` values for
    downsampled, upsampled (a side above the 256-patch grid), non-square and several-image grids."""
    from transformers import HYV4VLVisionConfig
    from transformers.models.hy_v4_vl.modeling_hy_v4_vl import HYV4VLVisionPatchEmbed

    from hfexport_dynamo._model_patches import _patch_hy_v4_vl_position_interpolation

    torch.manual_seed(0)
    config = HYV4VLVisionConfig(hidden_size=16, patch_size=8, num_channels=3, max_image_size=2048)
    embed = HYV4VLVisionPatchEmbed(config).eval()
    patched = _patch_hy_v4_vl_position_interpolation(HYV4VLVisionPatchEmbed.forward)
    for grid in ([[1, 8, 8]], [[1, 6, 10], [2, 4, 4]], [[1, 300, 7]]):
        grid = torch.tensor(grid)
        pixels = torch.randn(int(grid.prod(-1).sum()), 3 * 8 * 8)
        with torch.no_grad():
            # eager interpolates a channels-last view, whose CPU kernel differs from the contiguous one by up to
            # 2.2e-5 on a 300-row grid (the patch agrees with the contiguous kernel within 5e-7)
            torch.testing.assert_close(patched(embed, pixels, grid), HYV4VLVisionPatchEmbed.forward(embed, pixels, grid),
                                       atol=ATOL, rtol=RTOL)


@pytest.mark.slow  # two exports of the zoo's tiny Inkling2 with an image; about 25 s
def test_inkling2_checks_its_placeholder_count_without_indexing_by_the_mask():
    """The zoo gives Inkling2 one block of 2 x 2 patches per image token (``[tokens, 16, 16, 3]``, the grid counted
    in tokens); the vision tower traces, and its placeholder check on a masked index's ``numel()`` fails torch's
    range refinement without the patch."""
    from hfexport_sweep.zoo import build_case, image_inputs

    model, inputs, alt_inputs = build_case("inkling2/Inkling2Model")
    assert image_inputs(model).used and tuple(inputs["pixel_values"].shape) == (16, 16, 16, 3)
    assert inputs["image_grid_thw"].tolist() == [[1, 4, 4]]
    assert_exports_only_with(model, inputs, alt_inputs, "_patch_inkling2_placeholder_check",
                             "not a subset of src_bound")


@pytest.mark.slow  # two exports of the zoo's tiny Inkling with an image; about 20 s
def test_inkling_checks_its_placeholder_count_without_indexing_by_the_mask():
    """The zoo gives Inkling one ``[temporal patch, patch, patch, C]`` block per image token (``[64, 2, 8, 8, 3]``,
    channels last); its placeholder check is Inkling2's, copied: it fails torch's range refinement without the
    patch."""
    from hfexport_sweep.zoo import build_case, image_inputs

    model, inputs, alt_inputs = build_case("inkling_mm_model/InklingModel")
    assert image_inputs(model).tokens_per_image == 64 and tuple(inputs["pixel_values"].shape) == (64, 2, 8, 8, 3)
    assert_exports_only_with(model, inputs, alt_inputs, "_patch_inkling2_placeholder_check",
                             "not a subset of src_bound")


def test_kimi_k25_merge_index_with_item_counts_equals_the_original():
    """The patched temporal-merge index (counts by ``.item()``, each patch's video by comparisons) is the original's
    for images and videos of several sizes."""
    from transformers.models.kimi_k25 import modeling_kimi_k25

    from hfexport_dynamo._model_patches import _patch_kimi_k25_merge_index_counts

    original = modeling_kimi_k25.get_vision_temporal_merge_index
    patched = _patch_kimi_k25_merge_index_counts(original)
    for grid in ([[1, 8, 8]], [[1, 4, 6], [3, 2, 4], [2, 6, 2]]):
        grid = torch.tensor(grid)
        index, weight, tokens = patched(grid, 2, 2)
        want_index, want_weight, want_tokens = original(grid, 2, 2)
        assert torch.equal(index, want_index) and torch.equal(weight, want_weight) and tokens == want_tokens


def test_video_llama_3_pixel_unshuffle_as_a_gather_equals_its_interpolation():
    """The patched downsampling (the mean of each merge window's central patches) gives eager's per-image
    ``F.interpolate`` for merge sizes 1 to 4, mixed in one batch of images and videos."""
    from transformers.models.video_llama_3.modeling_video_llama_3 import VideoLlama3VisionModel

    from hfexport_dynamo._model_patches import _patch_video_llama_3_pixel_unshuffle

    original = VideoLlama3VisionModel.pixel_unshuffle
    patched = _patch_video_llama_3_pixel_unshuffle(original)
    generator = torch.Generator().manual_seed(0)
    for grid, merge in (([[1, 8, 8]], [1]), ([[1, 8, 8]], [2]), ([[2, 4, 6], [1, 6, 6], [1, 4, 4]], [2, 3, 1]),
                        ([[1, 8, 4]], [4])):
        grid, merge = torch.tensor(grid), torch.tensor(merge)
        hidden = torch.randn(int(grid.prod(1).sum()), 16, generator=generator)
        torch.testing.assert_close(patched(None, hidden, grid, merge), original(None, hidden, grid, merge),
                                   atol=1e-6, rtol=1e-5)


def test_udop_patch_combines_image_and_text_as_the_original_does():
    """UDOP's patched ``combine_image_text_embeddings`` gives the original's embeddings, boxes and mask (values and
    dtypes) on boxes where several words fall on one patch and some on none, two rows."""
    from transformers.models.udop import modeling_udop

    from hfexport_dynamo._model_patches import _patch_udop_combine_image_text

    original = modeling_udop.combine_image_text_embeddings
    patched = _patch_udop_combine_image_text(original)
    gen = torch.Generator().manual_seed(0)
    image = torch.randn(2, 16, 8, generator=gen)  # 4 x 4 patches of a 64-pixel image in 16-pixel patches
    text = torch.randn(2, 5, 8, generator=gen)
    boxes = torch.rand(2, 5, 2, 2, generator=gen).sort(dim=-2).values.flatten(-2)
    boxes[0, 1] = boxes[0, 0]  # two words on one patch
    boxes[1, 2] = 0.0  # an empty box: no image embedding added
    mask = torch.ones(2, 5, dtype=torch.long)
    want = original(image, text.clone(), boxes, None, mask, 4, 0, 64, 16)
    got = patched(image, text.clone(), boxes, None, mask, 4, 0, 64, 16)
    for w, g in zip(want, got, strict=True):
        assert w.dtype == g.dtype and w.shape == g.shape
        torch.testing.assert_close(g, w, atol=0, rtol=0)


@pytest.mark.slow  # two exports of the zoo's tiny UDOP with one image per row; about 15 s
def test_udop_exports_with_its_images_only_with_the_patch():
    """The zoo's UDOP case carries word boxes and one image per row; the patch selection iterates over a tensor
    without the patch, and the exported program matches eager at the zoo's second shape with it."""
    from hfexport_sweep.zoo import build_case, image_inputs

    model, inputs, alt_inputs = build_case("udop/UdopModel")
    assert image_inputs(model).kind == "per_row" and inputs["bbox"].shape == (*inputs["input_ids"].shape, 4)
    assert_exports_only_with(model, inputs, alt_inputs, "_patch_udop_combine_image_text",
                             "data is not allocated yet")
