"""Issue 28 ("vision traced"): multimodal zoo cases of the seeded sample that failed to build or got no media, given
the config values or media inputs their checkpoints and processors would (the cheap checks: configs and inputs; the
exports are the sweep's, figures in the commits)."""

from __future__ import annotations

import pytest
import torch

from hfexport_sweep import zoo


@pytest.mark.parametrize(("case_id", "frames"), [("instructblip/InstructBlipModel", 1),
                                                 ("instructblipvideo/InstructBlipVideoModel", 4)])
def test_a_qformer_model_gets_its_image_and_the_qformer_prompt(case_id, frames):
    """InstructBLIP's forward requires ``qformer_input_ids`` beside the image (the case failed eagerly: both missing),
    and its config leaves the placeholder token None (``image_token_index``; InstructBLIP-Video's
    ``video_token_index``): the case gets one image (4 frames for the video model), an 8-token Q-Former prompt, a free
    placeholder id and ``num_query_tokens`` (32) placeholders a frame, which the language model's output reads."""
    model, inputs, alt_inputs = zoo.build_case(case_id)
    media = zoo.image_inputs(model)
    assert media.used and media.kind == "qformer_input_ids" and media.tokens_per_image == 32 * frames, media
    token = getattr(model.config, "video_token_id" if frames > 1 else "image_token_id")
    assert token == zoo.TINY_VOCAB - 1
    for x in (inputs, alt_inputs):
        assert x["pixel_values"].shape[:2] == ((1, frames) if frames > 1 else (1, 3))
        assert x["qformer_input_ids"].shape == (1, 8)
        assert (x["input_ids"][0, :media.tokens_per_image] == token).all()
        assert int((x["input_ids"] == token).sum()) == media.tokens_per_image
    with torch.no_grad():
        text = model(**inputs).language_model_outputs.last_hidden_state
        moved = model(**{**inputs, "pixel_values": inputs["pixel_values"] + 1}).language_model_outputs.last_hidden_state
    assert not torch.allclose(text[0], moved[0]) and torch.equal(text[1:], moved[1:])  # only the first row's image


def test_idefics_reads_one_image_a_row_through_its_opened_cross_attention_gates():
    """IDEFICS cross-attends from the text to ``pixel_values [batch, images, C, H, W]`` under ``image_attention_mask
    [batch, seq, images]`` (the case got no media: 4-D pixels failed to unpack, and it requires one of its image
    inputs), behind tanh gates that init leaves zero: the case gets one image a row, every token attending to it, and
    gates drawn from N(0, 1), so the text reads the pixels."""
    model, inputs, alt_inputs = zoo.build_case("idefics/IdeficsModel")
    media = zoo.image_inputs(model)
    assert media.used and media.kind == "per_row", media
    for x in (inputs, alt_inputs):
        batch, seq = x["input_ids"].shape
        assert x["pixel_values"].shape[:2] == (batch, 1)
        assert x["image_attention_mask"].shape == (batch, seq, 1) and bool(x["image_attention_mask"].all())
    gates = [p for n, p in model.named_parameters() if n.endswith(("alpha_cross_attn", "alpha_dense"))]
    assert gates and all(bool(p.abs().gt(0).all()) for p in gates)


def test_kosmos_2_places_each_rows_image_at_its_latent_query_positions():
    """Kosmos-2 puts each row's image features at the ``image_embeds_position_mask`` positions (the case got no
    media: the mask was None): ``latent_query_num`` (64) ones in front of each row's text, and only the first row
    moves with the first image."""
    model, inputs, alt_inputs = zoo.build_case("kosmos-2/Kosmos2Model")
    media = zoo.image_inputs(model)
    assert media.used and media.kind == "per_row" and media.tokens_per_image == 64, media
    for x in (inputs, alt_inputs):
        batch, seq = x["input_ids"].shape
        assert x["pixel_values"].shape[0] == batch and x["attention_mask"].shape == (batch, seq)
        assert x["image_embeds_position_mask"].shape == (batch, seq)
        assert bool(x["image_embeds_position_mask"][:, :64].all()) and not x["image_embeds_position_mask"][:, 64:].any()
    pixels = inputs["pixel_values"].clone()
    pixels[0] += 1
    with torch.no_grad():
        out = model(**inputs).last_hidden_state
        moved = model(**{**inputs, "pixel_values": pixels}).last_hidden_state
    assert not torch.allclose(out[0], moved[0]) and torch.equal(out[1:], moved[1:])


def test_configs_whose_defaults_cannot_be_built_get_the_sizes_their_models_need():
    """Defaults that leave a size None or empty although the model cannot be built without it (each case failed
    construction): CohereCompass's rope parameters, one per layer type (KeyError: 'full_attention'), with an M-RoPE
    section of the tiny head; DeepSeek-OCR 2's mlp_layer_types (None is not subscriptable); DiffusionGemma's experts
    (nn.Linear(hidden, None))."""
    text = zoo.tiny_config("cohere_compass", with_vision=True).text_config
    assert set(text.rope_parameters) == set(text.layer_types) == {"full_attention"}
    head = text.hidden_size // text.num_attention_heads
    assert sum(text.rope_parameters["full_attention"]["mrope_section"]) == head // 2
    text = zoo.tiny_config("deepseek_ocr2", with_vision=True).text_config
    assert text.mlp_layer_types == ["dense", "sparse"] and text.num_hidden_layers == 2
    text = zoo.tiny_config("diffusion_gemma", with_vision=True).text_config
    assert (text.num_experts, text.top_k_experts, text.moe_intermediate_size) == (4, 2, 64)


def test_deepseek_ocr_2_reads_its_image_through_a_sam_neck_of_the_encoders_width():
    """DeepSeek-OCR 2's SAM neck ends in the width of the encoder it feeds (896 both by default; shrunk, 896 vs 64:
    torch.cat failed), and SAM's initializer_range (1e-10) left the image's signal at 1e-37 (the features did not
    depend on the pixels): the neck is [32, 64], the range 0.02 (multimodal cases only), and the case gets its image
    (145 tokens: 144 queries and the view separator)."""
    config = zoo.tiny_config("deepseek_ocr2", with_vision=True)
    assert config.vision_config.sam_config.downsample_channels == [32, 64] == [32, config.vision_config.encoder_config.hidden_size]
    assert config.vision_config.sam_config.initializer_range == 0.02
    assert zoo.tiny_config("deepseek_ocr2").vision_config.sam_config.initializer_range == 1e-10
    model, inputs, _ = zoo.build_case("deepseek_ocr2/DeepseekOcr2Model")
    media = zoo.image_inputs(model)
    assert media.used and media.kind == "pixel_values" and media.tokens_per_image == 145, media


def test_layoutlmv3_box_embeddings_are_as_wide_as_the_tiny_model_and_its_page_image_as_the_zoos():
    """LayoutLMv3 adds the concatenated embeddings of a token's box (4 coordinates, 2 sides) to its 64-wide
    embedding; they were 768 wide (the case failed eagerly), and its page image's position embeddings were sized for
    224 pixels: they are 4 * 10 + 2 * 12 = 64 wide and the page 64 pixels, and each row gets its page image."""
    config = zoo.tiny_config("layoutlmv3", "question-answering", with_vision=True)
    assert 4 * config.coordinate_size + 2 * config.shape_size == config.hidden_size == 64
    assert config.input_size == zoo.TINY_IMAGE
    model, inputs, _ = zoo.build_case("layoutlmv3/LayoutLMv3ForQuestionAnswering")
    media = zoo.image_inputs(model)
    assert media.used and media.kind == "per_row", media
    assert inputs["pixel_values"].shape == (inputs["input_ids"].shape[0], 3, 64, 64)


def test_a_diffusion_model_gets_the_canvas_it_refines():
    """DiffusionGemma draws its canvas with torch.randint when ``decoder_input_ids`` is None (two eager runs differed
    by 6.0, the dynamo export's check by 7.2): the case gives one, ``[batch, canvas_length]``, so its forward is a
    function of its inputs."""
    model, inputs, alt_inputs = zoo.build_case("diffusion_gemma/DiffusionGemmaModel")
    for x in (inputs, alt_inputs):
        assert x["decoder_input_ids"].shape == (x["input_ids"].shape[0], model.config.canvas_length)
    rows = {k: v[:2] for k, v in inputs.items()}
    with torch.no_grad():
        assert torch.equal(model(**rows).last_hidden_state, model(**rows).last_hidden_state)


def test_apertus_1_5_keeps_its_code_ranges_inside_the_tiny_vocabulary():
    """Apertus 1.5 embeds its image and audio codes as vocabulary ids, the audio range right after the image one and
    both inside the vocabulary (its validator: the audio range ended at 266440, beyond 512): 64 codes each, from
    256 and 320, below the placeholder tokens (the case's image: tests/dynamo/test_model_patches_vision.py, slow)."""
    config = zoo.tiny_config("apertus1p5", with_vision=True)
    assert config.vision_config.codebook_size == config.audio_config.codebook_size == 64
    assert (config.image_token_offset, config.audio_token_offset) == (256, 320)
    assert config.audio_token_offset + 64 <= min(config.image_token_id, config.audio_token_id)


def test_chameleon_gets_a_vocabulary_map_of_its_tiny_codebook():
    """Chameleon's ``vocabulary_map`` (its tokenizer's vocabulary, None by default: construction failed) names the
    image placeholder and one BPE id a VQ-GAN code: the codebook keeps 64 codes, at ids 256 to 319, ``"<image>"`` is
    a free id, and the case gets its image (16 codes of a 64-pixel image)."""
    config = zoo.tiny_config("chameleon", with_vision=True)
    assert config.vq_config.num_embeddings == 64 and len(config.vocabulary_map) == 65
    assert config.image_token_id == config.vocabulary_map["<image>"] == zoo.TINY_VOCAB - 1
    model, inputs, _ = zoo.build_case("chameleon/ChameleonModel")
    assert model.vocabulary_mapping.img2bpe == {i: 256 + i for i in range(64)}
    media = zoo.image_inputs(model)
    assert media.used and media.kind == "pixel_values" and media.tokens_per_image == 16, media


def test_ernie_4_5_vl_lists_its_temporal_rotary_section_last():
    """ERNIE 4.5 VL's ``mrope_section`` is height, width, temporal (``[22, 22, 20]``; it stacks the height and width
    sections, so they are equal): the tiny head's is ``[3, 3, 2]`` (Qwen-VL's order gave ``[2, 3, 3]`` and every
    forward failed: stack expects each tensor to be equal size); the case builds and gets its image."""
    rope = zoo.tiny_config("ernie4_5_vl_moe", with_vision=True).text_config.rope_parameters
    assert rope["mrope_section"] == [3, 3, 2]
    model, inputs, _ = zoo.build_case("ernie4_5_vl_moe/Ernie4_5_VLMoeModel")
    media = zoo.image_inputs(model)
    assert media.used and media.kind == "image_grid_thw" and media.tokens_per_image == 16, media


def test_granite_4_vision_injects_each_projection_at_its_own_layer():
    """Granite 4 Vision's ``deepstack_layer_map`` and ``downsample_rate`` are None by default (construction failed)
    and its ``spatial_target_layers`` name layers 12-21: the tiny config injects the vision tower's middle layer at
    LLM layer 0 and the four spatial groups at layers 1-4 of 5, with a 2/4 rate; the case gets its anyres image,
    its placeholder count taken from the first injection's rows."""
    config = zoo.tiny_config("granite4_vision", with_vision=True)
    assert config.deepstack_layer_map == [(1, 0)] and config.spatial_target_layers == [1, 2, 3, 4]
    assert config.text_config.num_hidden_layers == 5 and config.downsample_rate == "2/4"
    model, inputs, _ = zoo.build_case("granite4_vision/Granite4VisionModel")
    media = zoo.image_inputs(model)
    assert media.used and media.kind == "image_sizes" and media.tokens_per_image == 36, media
