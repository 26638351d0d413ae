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
