"""LLaVA-NeXT and LLaVA-OneVision for ``task="image-text-to-text"`` (issue 47): the ``vision`` program encodes every
image's anyres crops (the base crop and the tiles of the best grid pinpoint for its ``image_sizes``) as one batch of a
dynamic number of crops, and ``generate`` lays each image out as the model's ``pack_image_features`` does. The
development loop's check, on dynamo in process: a left-padded batch of a one-image prompt (tiled, unpadded and, for
OneVision's ``anyres_max_1``, downscaled) and a two-image prompt (OneVision: base crops only) gives eager's ids;
inputs that do not fit are refused by name before any program runs. LLaVA-NeXT's row is in the full suite (the
slow matrix covers it too). Every count and backend in a new process: ``test_image_counts.py`` (slow)."""

from __future__ import annotations

import pytest
import torch

import hfexport
from helpers import image_token_prompts, tiny_model

NEW_TOKENS, TOKEN, CROPS = 20, 99, 5
SIZES = torch.tensor([[22, 40], [30, 14], [16, 16]])  # (height, width): three aspect ratios


def _model(kind: str) -> torch.nn.Module:
    return tiny_model(kind, seed=5)


def _inputs(model: torch.nn.Module, counts: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor, dict]:
    """A left-padded batch, one row per count, each image's tokens (as the eager model lays it out) after two text
    tokens; the processor's zero-padded crops and ``image_sizes`` (and OneVision's ``batch_num_images``)."""
    total = sum(counts)
    media = {"pixel_values": torch.randn(total, CROPS, 3, 16, 16, generator=torch.Generator().manual_seed(4)),
             "image_sizes": SIZES[:total]}
    if "Onevision" in type(model).__name__:
        media["batch_num_images"] = torch.tensor(counts)
    with torch.no_grad():
        tokens = [f.shape[0] for f in model.model.get_image_features(**media).pooler_output]
    ids, mask = image_token_prompts(tokens, counts, TOKEN, text=4)
    return ids, mask, media


def _export(kind: str) -> tuple[torch.nn.Module, hfexport.ExportedModel]:
    model = _model(kind)
    return model, hfexport.export(model, backend="dynamo", task="image-text-to-text", max_batch=2, max_images=3,
                                  max_cache_len=64)


@pytest.fixture(scope="module")
def onevision():
    return _export("llava_onevision")


@pytest.fixture(scope="module", params=["llava_onevision", pytest.param("llava_next", marks=pytest.mark.slow)])
def exports(request, onevision):
    return onevision if request.param == "llava_onevision" else _export(request.param)


def test_tiled_and_base_crop_images_in_one_batch_generate_as_eager(exports):
    """NeXT tiles every image; OneVision the one-image prompt's, the two-image prompt's are their base crops."""
    model, exported = exports
    vision = exported.manifest["generation"]["vision"]
    onevision = "Onevision" in type(model).__name__
    assert vision["inputs"] == ["pixel_values", "image_sizes", *(["batch_num_images"] if onevision else [])]
    assert vision["anyres"]["max_crops"] == 3 * CROPS and vision["tokens_per_image"] == 4  # per crop: 2x2
    crops = exported.manifest["components"]["vision"]["inputs"][0]["dynamic_dims"]["0"]
    assert (crops["min"], crops["max"]) == (1, 3 * CROPS), crops
    ids, mask, media = _inputs(model, (1, 2))
    with torch.no_grad():
        expected = model.generate(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=NEW_TOKENS,
                                  **media)
    got = exported.generate(ids, mask, max_new_tokens=NEW_TOKENS, **media)
    assert torch.equal(got, expected), f"first difference at {(got != expected).nonzero()[:1].tolist()}"
    other = dict(media, pixel_values=torch.randn(media["pixel_values"].shape))
    assert not torch.equal(exported.generate(ids, mask, max_new_tokens=NEW_TOKENS, **other), got)  # images matter


@pytest.mark.parametrize("change,message", [
    (lambda media: media.pop("image_sizes"), r"need their image_sizes \[images, 2\]"),
    (lambda media: media.update(image_sizes=torch.tensor([[16, 48], [30, 14], [16, 16]])),
     r"input_ids hold \d+ image tokens \(id 99\) for image\(s\) of \[\d+, 5, 5\] tokens"),
    (lambda media: media.update(batch_num_images=torch.tensor([2, 2])), r"batch_num_images \[2, 2\] add up to 4"),
    (lambda media: media.update(pixel_values=media["pixel_values"][:, :1]), r"do not hold the crops"),
    (lambda media: media.update(pixel_values=media["pixel_values"][..., :8]), r"must be a float tensor"),
])
def test_onevision_inputs_that_do_not_fit_are_refused_by_name(onevision, change, message):
    model, exported = onevision
    ids, mask, media = _inputs(model, (1, 2))
    change(media)
    with pytest.raises((ValueError, TypeError), match=message):
        exported.generate(ids, mask, max_new_tokens=2, **media)
