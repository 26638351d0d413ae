"""Issue 47: images (audio chunks) per prompt as users send them. Each family exported with room for 4 images
(``max_images=4``; Voxtral: ``max_batch=4`` chunks) on every backend, saved, loaded in a new process, and generating
20 new tokens with 1, 2, 3 and 4 images in one prompt and in a left-padded batch of two prompts with different
counts (1 and 3): exactly eager ``model.generate(do_sample=False)``'s ids. Seeded configs at sizes unlike the other
tests' (LLaVA 40x40 images of 25 tokens, SmolVLM and Gemma 3 48x48 of 9 tokens, Qwen2-VL a non-square 4x6-patch
grid of 6 tokens, Voxtral chunks of 20 mel bins x 48 frames of 6 tokens).

Slow: 20 exports (an ExecuTorch one lowers three programs). LLaVA-OneVision is not a family of the
image-text-to-text task yet (its anyres tiling and ``image_sizes``): not in the matrix."""

from __future__ import annotations

from typing import Any

import pytest
import torch

import hfexport
from helpers import generate_in_fresh_process, selected_params, tiny_model

pytestmark = pytest.mark.slow

NEW_TOKENS = 20
TOKEN = 99  # every family's image (audio) token
BACKENDS = ["dynamo", "onnx", "executorch-xnnpack", "openvino"]
COUNTS = [(1,), (2,), (3,), (4,), (1, 3)]  # images per prompt; (1, 3): a batch of two prompts


def _vision(model_type: str, image_size: int, patch_size: int) -> dict[str, Any]:
    return dict(model_type=model_type, hidden_size=24, intermediate_size=40, num_hidden_layers=1,
                num_attention_heads=2, image_size=image_size, patch_size=patch_size)


# kind -> (helpers' kind, config overrides, tokens per image, export options)
FAMILIES: dict[str, tuple[str, dict[str, Any], int, dict[str, Any]]] = {
    "llava": ("llava", dict(vision_config=_vision("clip_vision_model", 40, 8)), 25, {}),
    "smolvlm": ("smolvlm", dict(vision_config=_vision("smolvlm_vision", 48, 8)), 9, {}),
    "gemma3": ("gemma3", dict(vision_config=_vision("siglip_vision_model", 48, 8), mm_tokens_per_image=9), 9, {}),
    "qwen2vl": ("qwen2vl", {}, 6, {"image_grid_thw": torch.tensor([[1, 4, 6]])}),
    "voxtral": ("voxtral", dict(audio_config=dict(num_mel_bins=20, max_source_positions=24, hidden_size=32,
                                                  num_hidden_layers=1, num_attention_heads=2,
                                                  intermediate_size=128)), 6, {}),
}
CASES = [pytest.param(backend, kind, id=f"{backend}-{kind}") for backend in BACKENDS for kind in FAMILIES]


def build(kind: str) -> torch.nn.Module:
    """The family's seeded model; its text model's positions raised to 160 (four LLaVA images are 100 tokens)."""
    from helpers import KINDS

    helper_kind, overrides, _, _ = FAMILIES[kind]
    text = dict(KINDS[helper_kind][2]["text_config"], max_position_embeddings=160)
    if "sliding_window" in text:  # Gemma 3: the cache must fit in the window (four images' prompt: 73 positions)
        text["sliding_window"] = 128
    model = tiny_model(helper_kind, seed=11, text_config=text, **overrides)
    if kind == "gemma3":  # transformers initializes the projection to zeros: every image would embed as zeros
        weight = model.model.multi_modal_projector.mm_input_projection_weight
        with torch.no_grad():
            weight.copy_(torch.randn(weight.shape, generator=torch.Generator().manual_seed(3)))
    return model


def prompt_len(kind: str, images: int) -> int:
    return 5 + images * (FAMILIES[kind][2] + 2)


def max_cache_len(kind: str) -> int:
    return prompt_len(kind, 4) + NEW_TOKENS + 4


def case_inputs(kind: str, counts: tuple[int, ...], seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, dict]:
    """``(input_ids, attention_mask, media and options)``: one row per count, each image's tokens one run after
    two text tokens, the shorter row left-padded; seeded images in the rows' order."""
    per = FAMILIES[kind][2]
    rows = []
    for row, count in enumerate(counts):
        ids = torch.randint(3, 90, (prompt_len(kind, count),), generator=torch.Generator().manual_seed(row + 5))
        for image in range(count):
            start = 2 + image * (per + 2)
            ids[start:start + per] = TOKEN
        rows.append(ids)
    width = max(len(r) for r in rows)
    ids = torch.zeros(len(rows), width, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, row in enumerate(rows):
        ids[i, width - len(row):], mask[i, width - len(row):] = row, 1
    total = sum(counts)
    gen = torch.Generator().manual_seed(100 + seed)
    media: dict[str, Any] = {"repetition_penalty": 1.5, "no_repeat_ngram_size": 2}
    if kind == "voxtral":
        media["input_features"] = torch.randn(total, 20, 48, generator=gen)
    elif kind == "qwen2vl":
        media.update(pixel_values=torch.randn(total * 24, 96, generator=gen),
                     image_grid_thw=torch.tensor([[1, 4, 6]] * total), mm_token_type_ids=(ids == TOKEN).int())
    elif kind == "smolvlm":  # [batch, images, C, H, W], all-zero padding images
        pixels = torch.zeros(len(counts), max(counts), 3, 48, 48)
        pixel_mask = torch.zeros(len(counts), max(counts), 48, 48, dtype=torch.bool)
        for i, count in enumerate(counts):
            pixels[i, :count] = torch.randn(count, 3, 48, 48, generator=gen)
            pixel_mask[i, :count] = True
        media.update(pixel_values=pixels, pixel_attention_mask=pixel_mask)
    else:
        size = 40 if kind == "llava" else 48
        media["pixel_values"] = torch.randn(total, 3, size, size, generator=gen)
        if kind == "gemma3":
            media["token_type_ids"] = (ids == TOKEN).long()
    return ids, mask, media


def export_case(backend: str, kind: str, directory) -> tuple[torch.nn.Module, hfexport.ExportedModel]:
    model = build(kind)
    _, _, _, example = FAMILIES[kind]
    if kind == "voxtral":
        options = dict(task="audio-text-to-text", max_batch=4)
    else:
        options = dict(task="image-text-to-text", max_batch=2, max_images=4)
    exported = hfexport.export(model, example or None, backend=backend, max_cache_len=max_cache_len(kind), **options)
    exported.save_pretrained(directory)
    return model, exported


@pytest.fixture(scope="module")
def runs(request, tmp_path_factory):
    """The selected cases exported and saved, then all generated in one new process: (backend, kind) -> (model,
    {counts: ids}) or the error of a failed export."""
    workdir = tmp_path_factory.mktemp("image-counts")
    models, todo = {}, {}
    for backend, kind in sorted(selected_params(request, "test_every_image_count_generates_as_eager", "backend",
                                                "kind"), key=lambda case: (case[0] != "onnx", case)):
        directory = workdir / f"{backend}-{kind}"
        try:
            models[backend, kind] = export_case(backend, kind, directory)[0]
        except Exception as error:  # noqa: BLE001 - re-raised by the case's test
            models[backend, kind] = error
            continue
        for counts in COUNTS:
            ids, mask, media = case_inputs(kind, counts)
            todo[f"{backend}-{kind}-{'-'.join(map(str, counts))}"] = (directory, [(ids, mask)],
                                                                     {**media, "max_new_tokens": NEW_TOKENS})
    return models, generate_in_fresh_process(todo, workdir, timeout=1800) if todo else {}


@pytest.mark.parametrize("backend,kind", CASES)
def test_every_image_count_generates_as_eager(backend, kind, runs):
    models, results = runs
    model = models[backend, kind]
    if isinstance(model, Exception):
        raise model
    wrong = []
    for counts in COUNTS:
        ids, mask, media = case_inputs(kind, counts)
        with torch.no_grad():
            expected = model.generate(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=NEW_TOKENS,
                                      **media)
        (got,) = results[f"{backend}-{kind}-{'-'.join(map(str, counts))}"]
        if got.shape != expected.shape or not torch.equal(got, expected):
            wrong.append(f"{counts} image(s): first difference at "
                         f"{(got != expected).nonzero()[:1].tolist() if got.shape == expected.shape else got.shape}")
    assert not wrong, "; ".join(wrong)


def test_the_images_change_the_tokens():
    """The check above compares tokens that depend on the images (not the text alone) for every family."""
    for kind in FAMILIES:
        model = build(kind)
        ids, mask, media = case_inputs(kind, (1, 3))
        _, _, other = case_inputs(kind, (1, 3), seed=1)
        with torch.no_grad():
            a = model.generate(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=NEW_TOKENS, **media)
            b = model.generate(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=NEW_TOKENS, **other)
        assert not torch.equal(a, b), kind


@pytest.mark.parametrize("image_size,patch_size", [(48, 8), (40, 4), (36, 3)])  # 6x6, 10x10, 12x12 patches
def test_smolvlm_on_onnx_at_three_resolutions(image_size, patch_size):
    """SmolVLM's position buckets (``arange(1/n, 1, 1/n)``) at n patches a side: 6x6 failed on ONNX (GatherND
    invalid index 5, ``_aten_arange_float_in_float64``); a prompt of two images generates eager's ids."""
    from helpers import KINDS

    tokens = (image_size // patch_size // 2) ** 2
    model = tiny_model("smolvlm", seed=11, vision_config=_vision("smolvlm_vision", image_size, patch_size),
                       text_config=dict(KINDS["smolvlm"][2]["text_config"], max_position_embeddings=160))
    exported = hfexport.export(model, backend="onnx", task="image-text-to-text", max_batch=1, max_images=2,
                               max_cache_len=5 + 2 * (tokens + 2) + NEW_TOKENS + 4)
    ids = torch.randint(3, 90, (1, 5 + 2 * (tokens + 2)), generator=torch.Generator().manual_seed(1))
    ids[0, 2:2 + tokens] = ids[0, 4 + tokens:4 + 2 * tokens] = TOKEN
    mask = torch.ones_like(ids)
    pixels = torch.randn(1, 2, 3, image_size, image_size, generator=torch.Generator().manual_seed(2))
    media = {"pixel_values": pixels, "repetition_penalty": 1.5, "no_repeat_ngram_size": 2}
    with torch.no_grad():
        expected = model.generate(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=NEW_TOKENS,
                                  **media)
    got = exported.generate(ids, mask, max_new_tokens=NEW_TOKENS, **media)
    assert torch.equal(got, expected), f"first difference at {(got != expected).nonzero()[:1].tolist()}"
