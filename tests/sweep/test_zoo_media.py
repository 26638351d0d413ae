"""Issue 28: a multimodal zoo case gets the media inputs its processor would build from the config (one image, or one
audio clip, with its placeholder tokens in the first row), and its dynamo export traces the vision (audio) tower:
the program's outputs equal eager at the alt shape, and move with the pixels (features).

One case per kind of media inputs: Qwen2-VL's flattened patches and ``image_grid_thw`` (baked into the program),
Mistral 3's Pixtral ``image_sizes`` (baked too), InternVL's plain ``pixel_values`` (whose pixel shuffle failed with
``Dim.AUTO`` on the image's height and width: the image dims are now static), GLM-ASR's ``input_features`` and
Gemma 4's patches with their ``image_position_ids``. Exported
and checked at the zoo's inputs cut to 2 and 3 rows, with the sweep's tolerance (atol 1e-4, rtol 1e-3).
"""

from __future__ import annotations

import pytest
import torch

from hfexport_sweep import zoo

ATOL, RTOL = 1e-4, 1e-3  # the sweep's tolerance

CASES = {
    "image_grid_thw": "qwen2_vl/Qwen2VLModel",
    "image_sizes": "mistral3/Mistral3Model",
    "pixel_values": "internvl/InternVLModel",
    "audio": "glmasr/GlmAsrModel",
    "image_position_ids": "gemma4/Gemma4Model",  # its vision config, None by default, filled in (with_vision)
}


def _first_rows(inputs: dict, rows: int) -> dict:
    """The zoo's inputs cut to their first ``rows`` text rows (the media stay: they belong to the first row), to keep
    the test fast."""
    from hfexport_dynamo.inputs import TOKEN_INPUTS

    def cut(name: str, value: torch.Tensor) -> torch.Tensor:
        if name == "position_ids" and value.dim() == 3:  # M-RoPE positions [3, batch, seq]
            return value[:, :rows]
        return value[:rows] if name in (*TOKEN_INPUTS, "mm_token_type_ids") else value

    return {k: cut(k, v) for k, v in inputs.items()}


# Qwen2-VL's and Gemma 4's towers cost the most to trace (79 s and 36 s at load 7, 2026-12-07): in the full suite;
# the default set keeps a baked patch grid (image_sizes), plain pixels and audio
SLOW_KINDS = ("image_grid_thw", "image_position_ids")


@pytest.mark.parametrize("kind", [pytest.param(k, marks=pytest.mark.slow) if k in SLOW_KINDS else k for k in CASES])
def test_a_multimodal_case_gets_its_media_and_the_dynamo_export_traces_the_tower(kind):
    import hfexport

    model, inputs, alt_inputs = zoo.build_case(CASES[kind])
    media = zoo.image_inputs(model)
    assert media.used and media.kind == kind and media.tokens_per_image > 0, media
    key = "input_features" if kind == "audio" else "pixel_values"
    token = zoo._token_id(model.config, zoo._AUDIO_TOKEN_KEYS if kind == "audio" else zoo._IMAGE_TOKEN_KEYS)
    for x in (inputs, alt_inputs):
        assert (x["input_ids"][0, :media.tokens_per_image] == token).all()
        assert int((x["input_ids"] == token).sum()) == media.tokens_per_image  # only there
    assert inputs[key].shape == alt_inputs[key].shape  # one image (clip) of the config's size at both shapes

    inputs, alt_inputs = _first_rows(inputs, 2), _first_rows(alt_inputs, 3)
    exported = hfexport.export(model, inputs, backend="dynamo", dynamic=True, verify=False)
    fixed = exported.manifest["fixed_kwargs"]
    layout = {"image_grid_thw": "image_grid_thw", "image_sizes": "image_sizes"}.get(kind)
    if layout:  # the patch grid (image size) is baked in: the model reads its values; another one is refused by name
        assert fixed[layout] == inputs[layout].tolist()
        with pytest.raises(ValueError, match=f"{layout}=.*baked into this export"):
            exported(**{**inputs, layout: inputs[layout] * 2})
    if key == "pixel_values":  # with dynamic=True, the image's own dims are static: the processor's size
        pixels = next(i for i in exported.manifest["inputs"] if i["name"] == "pixel_values")
        assert [int(d) for d in pixels["shape"][1:]] == list(inputs["pixel_values"].shape[1:])
    alt = {k: v for k, v in alt_inputs.items() if k not in fixed}
    report = exported.verify(alt, atol=ATOL, rtol=RTOL)
    assert report.passed, report
    moved = {**alt, key: alt[key] + 1.0}
    first = next(iter(exported(**alt).values()))
    other = next(iter(exported(**moved).values()))
    with torch.no_grad():
        eager = next(iter(model(**{**alt_inputs, key: moved[key]}).values()))
    assert (first[0] - other[0]).abs().max() > 1e-3  # the image's row reads the traced tower
    torch.testing.assert_close(other, eager, atol=ATOL, rtol=RTOL)



def test_an_audio_head_gets_the_masks_its_base_model_wants_through_kwargs():
    """MOSS-Transcribe-Diarize's head passes ``padding_mask`` on to its base model's ``get_audio_features`` through
    ``**kwargs``: the feature count is taken with it, so the case gets its audio clip (it fell back to text)."""
    model, inputs, alt_inputs = zoo.build_case("moss_transcribe_diarize/MossTranscribeDiarizeForConditionalGeneration")
    media = zoo.image_inputs(model)
    assert media.used and media.kind == "audio" and media.tokens_per_image == 16, media
    for x in (inputs, alt_inputs):
        assert x["padding_mask"].shape == x["input_features_mask"].shape == (1, x["input_features"].shape[-1])
        assert int((x["input_ids"] == model.config.audio_token_id).sum()) == 16


def test_a_config_without_an_image_token_id_gets_a_free_one():
    """MiniCPM-V 4.6 declares ``image_token_id`` but leaves it None (its processor adds the token): the tiny config
    of the multimodal case gets the highest id no other token key uses, and the case its image (it was text only:
    the forward never placed the features)."""
    model, inputs, _ = zoo.build_case("minicpmv4_6/MiniCPMV4_6Model")
    token = model.config.image_token_id
    assert token == zoo.TINY_VOCAB - 1
    media = zoo.image_inputs(model)
    assert media.used and media.kind == "target_sizes" and media.tokens_per_image > 0, media
    assert int((inputs["input_ids"] == token).sum()) == media.tokens_per_image
    assert zoo.tiny_config("minicpmv4_6").image_token_id is None  # only with_vision fills it in


def test_a_vision_projection_as_wide_as_the_text_model_stays_so():
    """Florence-2's vision ``projection_dim`` equals its text ``d_model`` (1024) by default: the tiny config keeps them
    equal (64; the caps made them 32 and 64, and the image features were no rows of the text width), so the case gets
    its image."""
    model, inputs, _ = zoo.build_case("florence2/Florence2Model")
    assert model.config.vision_config.projection_dim == model.config.text_config.d_model == 64
    media = zoo.image_inputs(model)
    assert media.used and media.kind == "pixel_values" and media.tokens_per_image == 5, media


def test_a_merged_vision_width_stays_the_vision_width_times_the_merge_squared():
    """MuseGlimmer's ``out_hidden_size`` (its adapter's input, the merged vision features) is the vision width times
    ``merge_size ** 2`` by default: the multimodal case's tiny config keeps it so (256, where the caps gave 64)."""
    config = zoo.tiny_config("muse_glimmer", with_vision=True)
    assert config.out_hidden_size == config.vision_config.hidden_size * config.vision_config.merge_size ** 2 == 256
    assert zoo.tiny_config("muse_glimmer").out_hidden_size == 64  # only with_vision fits it


def test_a_pyramid_keeps_one_layer_per_stage():
    """Muse Spark's audio tower is a pyramid, one layer per stage of ``hidden_sizes`` (its validator wants as many
    ``patch_sizes``, ``hidden_sizes`` and ``depths`` as layers): the stages stay (4), shrunk; the case builds (it
    failed: 2, 4 and 4 entries for 2 layers) and gets its image."""
    audio = zoo.tiny_config("muse_spark", with_vision=True).audio_config
    assert audio.num_hidden_layers == len(audio.patch_sizes) == len(audio.hidden_sizes) == len(audio.depths) == 4
    assert list(audio.hidden_sizes) == [16, 32, 64, 128] and list(audio.depths) == [1, 1, 1, 1]


def test_an_adapter_reads_the_last_layers_of_the_shrunk_vision_tower():
    """Molmo2's ``adapter_config.vision_feature_layer`` ([24, 18]) indexes the vision tower's layers: the tiny config
    gives the shrunk tower's last two, deepest first ([1, 0]), so the case builds (it failed validation)."""
    config = zoo.tiny_config("molmo2", with_vision=True)
    assert config.vision_config.num_hidden_layers == 2
    assert config.adapter_config.vision_feature_layer == [1, 0]


@pytest.mark.parametrize("model_type", ["qwen2_5_omni_thinker", "qwen3_omni_moe_thinker"])
def test_a_thinker_config_gets_the_vision_start_token_its_checkpoints_carry(model_type):
    """The Qwen Omni thinkers' get_rope_index reads ``config.vision_start_token_id``, which their config class does not
    declare (the released checkpoints' thinker_config carries it: 151652): the tiny config has it, moved into the tiny
    vocab apart from the other token ids (every forward failed with an AttributeError)."""
    config = zoo.tiny_config(model_type, with_vision=True)
    token = config.vision_start_token_id
    assert 0 <= token < zoo.TINY_VOCAB
    assert token not in (config.image_token_id, config.audio_token_id, config.video_token_id)


def test_whole_mrope_positions_computed_in_float_are_given_as_ids():
    """Qwen3-Omni's get_rope_index computes its M-RoPE positions in float32: the case's ``position_ids`` are the same
    whole numbers as int64 (an export takes position ids as integers), and the case gets its image."""
    model, inputs, alt_inputs = zoo.build_case("qwen3_omni_moe_thinker/Qwen3OmniMoeThinkerModel")
    media = zoo.image_inputs(model)
    assert media.used and media.kind == "image_grid_thw" and media.tokens_per_image == 16, media
    for x in (inputs, alt_inputs):
        assert x["position_ids"].dtype == torch.long and x["position_ids"].shape[0] == 3


def test_a_document_model_gets_word_boxes():
    """UDOP requires a box per token (its relative position bias raised without): the multimodal case gets ``bbox``
    ``[batch, seq, 4]``, page fractions with ``x0 <= x1`` and ``y0 <= y1``, and one image per row."""
    model, inputs, alt_inputs = zoo.build_case("udop/UdopModel")
    assert zoo.image_inputs(model).kind == "per_row"
    for x in (inputs, alt_inputs):
        boxes = x["bbox"]
        assert boxes.shape == (*x["input_ids"].shape, 4) and boxes.is_floating_point()
        assert ((0 <= boxes) & (boxes <= 1)).all()
        assert (boxes[..., :2] <= boxes[..., 2:]).all()


def test_a_sliding_window_the_forward_needs_is_set():
    """Step3p7's text model builds a sliding-window mask whatever its layer types (all full attention by default),
    and its config class leaves ``sliding_window`` None: the tiny config sets one, so the case builds and gets its
    image (every forward failed)."""
    assert zoo.tiny_config("step3p7", with_vision=True).text_config.sliding_window == 512
    model, _, _ = zoo.build_case("step3p7/Step3p7Model")
    media = zoo.image_inputs(model)
    assert media.used and media.kind == "pixel_values" and media.tokens_per_image == 4, media


def test_a_high_res_tower_reads_a_layer_it_has():
    """DeepSeek-VL hybrid reads its SAM tower's hidden state after ``global_attn_indexes[0]`` ([2, 5, 8, 11] of 12
    layers): with 2 layers the indexes become the last one, and the case gets its image at both resolutions (it was
    text only: IndexError)."""
    config = zoo.tiny_config("deepseek_vl_hybrid", with_vision=True)
    assert config.high_res_vision_config.num_hidden_layers == 2
    assert config.high_res_vision_config.global_attn_indexes == [1]
    model, inputs, _ = zoo.build_case("deepseek_vl_hybrid/DeepseekVLHybridModel")
    media = zoo.image_inputs(model)
    assert media.used and media.tokens_per_image == 64 and "high_res_pixel_values" in inputs, media


def test_a_vision_tower_keeps_no_more_key_value_heads_than_heads():
    """EXAONE 4.5's vision tower has 16 heads and 8 key/value heads (``num_heads``, no ``num_attention_heads``): the
    tiny tower's 4 heads get 2 key/value heads (it kept 8: its attention failed, 4 vs 8 heads)."""
    vision = zoo.tiny_config("exaone4_5", with_vision=True).vision_config
    assert (vision.num_heads, vision.num_key_value_heads) == (4, 2)



def test_an_image_embedded_as_flattened_patches_gets_them():
    """Fuyu embeds its image's flattened patches ``[1, patches, C * patch * patch]`` with a linear layer and returns
    them as the last hidden state (no pooler output): the case gets the 64 patches of its 64-pixel image and as many
    placeholders (it was text only: the 4-D image failed the linear layer)."""
    model, inputs, _ = zoo.build_case("fuyu/FuyuModel")
    media = zoo.image_inputs(model)
    assert media.used and media.kind == "pixel_values" and media.tokens_per_image == 64, media
    assert inputs["pixel_values"].shape == (1, 64, 3 * 8 * 8)


def test_a_unified_embedder_gets_one_patch_per_merged_model_patch():
    """Gemma 4 unified embeds model patches of ``pooling_kernel_size * patch_size`` pixels (24: ``[1, n, 3 * 24 *
    24]``), where Gemma 4's tower takes 8-pixel patches it pools 3 x 3: the case gets the 2 x 2 model patches of its
    64-pixel image, their (x, y) and 4 placeholders (it was text only: LayerNorm of 1728 on 192 values)."""
    model, inputs, _ = zoo.build_case("gemma4_unified/Gemma4UnifiedForConditionalGeneration")
    media = zoo.image_inputs(model)
    assert media.used and media.kind == "image_position_ids" and media.tokens_per_image == 4, media
    assert inputs["pixel_values"].shape == (1, 4, 1728)
    assert inputs["image_position_ids"].tolist() == [[[0, 0], [1, 0], [0, 1], [1, 1]]]


def test_a_channels_last_patch_block_per_token():
    """Inkling's vision tower folds each ``[temporal patch, patch, patch, C]`` block (channels last) into one image
    token: the case gets the 64 blocks of its 64-pixel image and 64 placeholders (it was text only: its fold unpacked
    a 4-D image into 5 dims)."""
    model, inputs, _ = zoo.build_case("inkling_mm_model/InklingModel")
    media = zoo.image_inputs(model)
    assert media.used and media.kind == "pixel_values" and media.tokens_per_image == 64, media
    assert inputs["pixel_values"].shape == (64, 2, 8, 8, 3)


def test_flattened_patches_one_image_a_row():
    """Kosmos-2.5's forward takes Pix2Struct's ``flattened_patches`` (each patch's row and column from 1, then its 16 x
    16 x 3 pixels), not ``pixel_values``: each row gets the 16 patches of a 64-pixel image and its
    ``image_embeds_position_mask``, ``latent_query_num`` (2048, shrunk to Kosmos-2's 64) ones before the text (it was
    text only: forward takes no pixel_values)."""
    model, inputs, alt_inputs = zoo.build_case("kosmos-2.5/Kosmos2_5Model")
    assert zoo.image_inputs(model) == zoo.ImageInputs(True, tokens_per_image=64, kind="per_row")
    for x in (inputs, alt_inputs):
        batch = x["input_ids"].shape[0]
        patches = x["flattened_patches"]
        assert patches.shape == (batch, 16, 2 + 768)
        assert patches[0, :, :2].tolist() == [[r, c] for r in range(1, 5) for c in range(1, 5)]
        assert (x["image_embeds_position_mask"].sum(-1) == 64).all()
        assert (x["image_embeds_position_mask"][:, :64] == 1).all()


def test_a_vision_language_action_model_gets_a_camera_image_a_row_and_its_actions():
    """PI0's forward requires ``action_embeds`` (it failed eagerly without) and reads one camera image a row
    (``[batch, 1, C, H, W]`` and ``pixel_attention_mask [batch, 1]``) at its PaliGemma's image tokens: every row
    starts with the 64 placeholders; the PaliGemma's projection stays the text width (64; the caps gave 32)."""
    model, inputs, alt_inputs = zoo.build_case("pi0/PI0Model")
    vlm = model.config.vlm_config
    assert vlm.vision_config.projection_dim == vlm.text_config.hidden_size == 64
    media = zoo.image_inputs(model)
    assert media == zoo.ImageInputs(True, tokens_per_image=64, kind="cameras"), media
    assert media.describe() == "one camera image per row, 64 placeholder tokens each (cameras)"
    for x in (inputs, alt_inputs):
        batch = x["input_ids"].shape[0]
        assert x["pixel_values"].shape == (batch, 1, 3, 64, 64) and x["pixel_attention_mask"].all()
        assert x["action_embeds"].shape == (batch, 1 + model.config.chunk_size, model.config.dit_config.hidden_size)
        assert (x["input_ids"][:, :64] == vlm.image_token_id).all()
        assert int((x["input_ids"] == vlm.image_token_id).sum()) == 64 * batch


def test_a_pooling_adapter_gets_one_crop_and_its_pooling_windows():
    """Molmo2's tiny config follows its shrunk tower (64 position embeddings for 8 x 8 patches, the adapter's
    ``text_hidden_size`` the text width, ``image_patch_id`` inside the tiny vocab and never drawn as text), and the
    case gets one crop's patches, the 2 x 2 window each of its 16 image tokens pools and the pooled grid (it was not
    instantiable, then text only: get_image_features wants image_token_pooling and image_grids)."""
    model, inputs, alt_inputs = zoo.build_case("molmo2/Molmo2Model")
    config = model.config
    assert config.vision_config.num_position_embeddings == 64 and config.adapter_config.text_hidden_size == 64
    assert config.image_token_id == config.image_patch_id < zoo.TINY_VOCAB
    media = zoo.image_inputs(model)
    assert media.used and media.kind == "image_token_pooling" and media.tokens_per_image == 16, media
    assert inputs["pixel_values"].shape == (1, 64, 192) and inputs["image_grids"].tolist() == [[4, 4, 0, 0]]
    assert inputs["image_token_pooling"][:2].tolist() == [[0, 1, 8, 9], [2, 3, 10, 11]]
    for x in (inputs, alt_inputs):
        assert int((x["input_ids"] == config.image_token_id).sum()) == 16
