"""Issue 47: images (audio chunks) per prompt as users send them. Each family exported with room for 4 images
(``max_images=4``; Voxtral: ``max_batch=4`` chunks) on every backend, saved, loaded in a new process, and generating
20 new tokens with 1, 2, 3 and 4 images in one prompt and in a left-padded batch of two prompts with different
counts (1 and 3): exactly eager ``model.generate(do_sample=False)``'s ids. Seeded configs at sizes unlike the other
tests' (LLaVA 40x40 images of 25 tokens, SmolVLM and Gemma 3 48x48 of 9 tokens, Qwen2-VL a non-square 4x6-patch
grid of 6 tokens, Voxtral chunks of 20 mel bins x 48 frames of 6 tokens, LLaVA-NeXT and LLaVA-OneVision crops of
20x20 in 10-pixel patches, each image tiled by the best of four grid pinpoints for its own ``image_sizes``: four
sizes, three aspect ratios; OneVision's images in a prompt of several are their base crop, so that its counts
exercise both layouts, and the (1, 3) batch both in one call).

Slow: 28 exports (an ExecuTorch one lowers three programs)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

import hfexport
from helpers import generate_in_fresh_process, image_token_prompts, selected_params, tiny_model

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
# LLaVA-NeXT / OneVision (anyres): 20x20 crops of 2x2 tokens; tokens per image vary with its size (ANYRES_SIZES)
_PINPOINTS = [[20, 40], [40, 20], [40, 40], [20, 60]]
for _kind in ("llava_next", "llava_onevision"):
    # NeXT reads the CLIP tower's second-to-last hidden states: two layers, so that one of them runs
    FAMILIES[_kind] = (_kind, dict(vision_config=dict(_vision("clip_vision_model", 20, 10), num_hidden_layers=2)
                                   if _kind == "llava_next" else _vision("siglip_vision_model", 20, 10),
                                   image_grid_pinpoints=_PINPOINTS), 0, {})
ANYRES_SIZES = [[25, 45], [38, 22], [20, 20], [50, 35]]  # (height, width) of the images in a call, in order
ANYRES_CROPS = 5  # the processor's crops per image, zero-padded: the base and at most 4 tiles
CASES = [pytest.param(backend, kind, id=f"{backend}-{kind}") for backend in BACKENDS for kind in FAMILIES]


def anyres_tokens(kind: str, counts: tuple[int, ...]) -> list[int]:
    """Each image's tokens in the prompt, as the eager model lays them out (its ``get_image_features``)."""
    model, total = build(kind), sum(counts)
    options = {"batch_num_images": torch.tensor(counts)} if kind == "llava_onevision" else {}
    with torch.no_grad():
        features = model.model.get_image_features(torch.zeros(total, ANYRES_CROPS, 3, 20, 20),
                                                  torch.tensor(ANYRES_SIZES[:total]), **options).pooler_output
    return [f.shape[0] for f in features]


def image_tokens(kind: str, counts: tuple[int, ...]) -> list[int]:
    """Each image's tokens in the prompt, the images of every row in order."""
    if FAMILIES[kind][0] in ("llava_next", "llava_onevision"):
        return anyres_tokens(kind, counts)
    return [FAMILIES[kind][2]] * sum(counts)


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


def prompt_len(tokens: list[int]) -> int:
    return 5 + sum(per + 2 for per in tokens)


def max_cache_len(kind: str) -> int:
    return max(prompt_len(image_tokens(kind, counts)) for counts in COUNTS) + NEW_TOKENS + 4


def case_inputs(kind: str, counts: tuple[int, ...], seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, dict]:
    """``(input_ids, attention_mask, media and options)``: one row per count, each image's tokens one run after
    two text tokens, the shorter row left-padded; seeded images in the rows' order."""
    ids, mask = image_token_prompts(image_tokens(kind, counts), counts, TOKEN, text=5, seed=5)  # text: prompt_len
    total = sum(counts)
    gen = torch.Generator().manual_seed(100 + seed)
    media: dict[str, Any] = {"repetition_penalty": 1.5, "no_repeat_ngram_size": 2}
    if kind == "voxtral":
        media["input_features"] = torch.randn(total, 20, 48, generator=gen)
    elif kind == "qwen2vl":
        media.update(pixel_values=torch.randn(total * 24, 96, generator=gen),
                     image_grid_thw=torch.tensor([[1, 4, 6]] * total), mm_token_type_ids=(ids == TOKEN).int())
    elif kind in ("llava_next", "llava_onevision"):  # the processor's crops [images, crops, C, H, W], image_sizes
        media.update(pixel_values=torch.randn(total, ANYRES_CROPS, 3, 20, 20, generator=gen),
                     image_sizes=torch.tensor(ANYRES_SIZES[:total]))
        if kind == "llava_onevision":
            media["batch_num_images"] = torch.tensor(counts)
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
