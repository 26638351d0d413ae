"""Vision-language models exported for ``task="image-text-to-text"`` (issue 28): the ``vision``, ``embed`` and
``decoder`` programs, and greedy ``generate(input_ids, attention_mask, pixel_values=...)`` that merges the image
embeddings at the image tokens as the model's forward does, with exactly eager ``model.generate(do_sample=False)``'s
token ids, after ``save_pretrained`` and ``hfexport.load`` in a new process; a left-padded batch of two prompts with
one image each. Bad images are refused by name before any program runs."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
import torch

import hfexport
from helpers import generate_in_fresh_process, selected_params, tiny_model

NEW_TOKENS = 20
IMAGE_TOKEN, TOKENS_PER_IMAGE = 99, 16  # the tiny LLaVA's: a 32x32 image in 8x8 patches
SMOLVLM_TOKENS_PER_IMAGE = 4  # the tiny SmolVLM's: 16 patches, pixel-shuffled by 2
KINDS = ["llava", "smolvlm", "idefics3", "gemma3", "qwen2vl", "qwen2_5_vl"]
# The development loop: each family's code path on dynamo (an export of the three programs takes ~2 s) and one ONNX
# export, Gemma 3's (its own attention path: the fused GroupQueryAttention broke its image blocks); the rest is slow
# (an ONNX export ~8 s, ExecuTorch ~30 s of lowering three programs; Idefics3 is SmolVLM's path under its classes)
QUICK = {("dynamo", "llava"), ("dynamo", "smolvlm"), ("dynamo", "gemma3"), ("onnx", "gemma3"), ("dynamo", "qwen2vl"),
         ("dynamo", "qwen2_5_vl")}
CASES = [pytest.param(backend, kind, id=f"{backend}-{kind}", marks=() if (backend, kind) in QUICK else pytest.mark.slow)
         for backend in ("dynamo", "onnx", "executorch-xnnpack") for kind in KINDS]


def batch_with_images(seed: int = 3, pixel_seed: int = 1) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """LLaVA: two prompts of 24 positions, the second left-padded by 3, each holding one image's 16 image tokens at
    its own offset; two seeded 32x32 images (the seeds give 20 new tokens that vary and depend on the images)."""
    ids = torch.randint(3, 90, (2, 24), generator=torch.Generator().manual_seed(seed))
    ids[0, 2:2 + TOKENS_PER_IMAGE] = IMAGE_TOKEN
    ids[1, 5:5 + TOKENS_PER_IMAGE] = IMAGE_TOKEN
    mask = torch.ones_like(ids)
    ids[1, :3], mask[1, :3] = 0, 0
    pixel_values = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(pixel_seed))
    return ids, mask, pixel_values


def smolvlm_batch(pixel_seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
    """SmolVLM, Idefics3: two prompts of 16 positions, the second left-padded by 3; the first holds two images, the second
    one, so that the processor's ``pixel_values [2, 2, 3, 32, 32]`` hold an all-zero padding image (masked out in
    ``pixel_attention_mask``), which the model drops."""
    ids = torch.randint(3, 90, (2, 16), generator=torch.Generator().manual_seed(0))
    ids[0, 2:6] = ids[0, 8:12] = ids[1, 5:9] = IMAGE_TOKEN
    mask = torch.ones_like(ids)
    ids[1, :3], mask[1, :3] = 0, 0
    pixel_values = torch.randn(2, 2, 3, 32, 32, generator=torch.Generator().manual_seed(pixel_seed))
    pixel_values[1, 1] = 0
    pixel_mask = torch.ones(2, 2, 32, 32, dtype=torch.bool)
    pixel_mask[1, 1] = False
    return ids, mask, {"pixel_values": pixel_values, "pixel_attention_mask": pixel_mask}


def gemma3_batch(pixel_seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, dict[str, Any]]:
    """Gemma 3: two prompts of 14 positions, the second left-padded by 3, one image (4 tokens) each, the processor's
    ``token_type_ids``; with a repetition penalty and no repeated bigrams, without which the tiny Gemma repeats one
    or two tokens (the same options go to eager and to the export)."""
    ids = torch.randint(3, 90, (2, 14), generator=torch.Generator().manual_seed(4))
    ids[0, 2:6] = ids[1, 5:9] = IMAGE_TOKEN
    mask = torch.ones_like(ids)
    ids[1, :3], mask[1, :3] = 0, 0
    pixel_values = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(pixel_seed))
    return ids, mask, {"pixel_values": pixel_values, "token_type_ids": (ids == IMAGE_TOKEN).long(),
                       "repetition_penalty": 1.5, "no_repeat_ngram_size": 2}


def qwen2vl_batch(pixel_seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, dict[str, Any]]:
    """Qwen2-VL: two prompts of 16 positions, the second left-padded by 3; the first holds two images (4 tokens
    each: a 4x4 grid of patches merged 2x2), the second one, so that the 3-D RoPE positions of text after an image
    run on from ``max(h, w)``; the processor's packed patches ``[3 * 16, 96]``, ``image_grid_thw`` and
    ``mm_token_type_ids``, with the repetition penalty and bigram ban of the Gemma 3 case."""
    ids = torch.randint(3, 90, (2, 16), generator=torch.Generator().manual_seed(4))
    ids[0, 2:6] = ids[0, 8:12] = ids[1, 5:9] = IMAGE_TOKEN
    mask = torch.ones_like(ids)
    ids[1, :3], mask[1, :3] = 0, 0
    pixel_values = torch.randn(3 * 16, 96, generator=torch.Generator().manual_seed(pixel_seed))
    return ids, mask, {"pixel_values": pixel_values, "image_grid_thw": torch.tensor([[1, 4, 4]] * 3),
                       "mm_token_type_ids": (ids == IMAGE_TOKEN).int(), "repetition_penalty": 1.5,
                       "no_repeat_ngram_size": 2}


def qwen2_5_vl_batch(pixel_seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, dict[str, Any]]:
    """Qwen2.5-VL: :func:`qwen2vl_batch`'s layout at 24x24 images (6x6 patches, 9 image tokens each, in 4 windows of
    its windowed block), prompts of 26 positions."""
    ids = torch.randint(3, 90, (2, 26), generator=torch.Generator().manual_seed(4))
    ids[0, 2:11] = ids[0, 13:22] = ids[1, 5:14] = IMAGE_TOKEN
    mask = torch.ones_like(ids)
    ids[1, :3], mask[1, :3] = 0, 0
    pixel_values = torch.randn(3 * 36, 96, generator=torch.Generator().manual_seed(pixel_seed))
    return ids, mask, {"pixel_values": pixel_values, "image_grid_thw": QWEN2_5_VL_GRID.repeat(3, 1),
                       "mm_token_type_ids": (ids == IMAGE_TOKEN).int(), "repetition_penalty": 1.5,
                       "no_repeat_ngram_size": 2}


QWEN2_5_VL_GRID = torch.tensor([[1, 6, 6]])  # the export's image size, given as the example's image_grid_thw


def case_inputs(kind: str, other_images: bool = False) -> tuple[torch.Tensor, torch.Tensor, dict[str, Any]]:
    """``(input_ids, attention_mask, the images and options generate takes)`` of a family's case."""
    if kind == "qwen2_5_vl":
        return qwen2_5_vl_batch(pixel_seed=5 if other_images else 0)
    if kind == "qwen2vl":
        return qwen2vl_batch(pixel_seed=5 if other_images else 0)
    if kind == "gemma3":
        return gemma3_batch(pixel_seed=5 if other_images else 0)
    if kind in ("smolvlm", "idefics3"):
        return smolvlm_batch(pixel_seed=5 if other_images else 0)
    ids, mask, pixel_values = batch_with_images(pixel_seed=0 if other_images else 1)
    return ids, mask, {"pixel_values": pixel_values}


def vlm(kind: str) -> torch.nn.Module:
    """``tiny_model(kind)``; Gemma 3's image projection, which transformers initializes to zeros (every image then
    embeds as zeros and no image changes a token), drawn from a seeded normal."""
    model = tiny_model(kind)
    if kind == "gemma3":
        weight = model.model.multi_modal_projector.mm_input_projection_weight
        with torch.no_grad():
            weight.copy_(torch.randn(weight.shape, generator=torch.Generator().manual_seed(0)))
    return model


def eager_generate(model: torch.nn.Module, ids: torch.Tensor, mask: torch.Tensor, **options) -> torch.Tensor:
    """``model.generate(do_sample=False)``; ``options``: the images (``pixel_values``, ...) and generation options."""
    with torch.no_grad():
        return model.generate(input_ids=ids, attention_mask=mask, do_sample=False,
                              **{"max_new_tokens": NEW_TOKENS, **options})


def export_case(backend: str, kind: str, directory) -> tuple[torch.nn.Module, hfexport.ExportedModel]:
    """A family's case exported (``max_batch=2``, ``max_cache_len=48``: the longest prompt, 26 positions, and its
    20 new tokens fit; up to 3 images where a prompt of the case holds two) and saved."""
    model = vlm(kind)
    exported = hfexport.export(model, {"image_grid_thw": QWEN2_5_VL_GRID} if kind == "qwen2_5_vl" else None,
                               backend=backend, task="image-text-to-text", max_batch=2, max_cache_len=48,
                               max_images=3 if kind in ("smolvlm", "idefics3", "qwen2vl", "qwen2_5_vl") else None)
    exported.save_pretrained(directory)
    return model, exported


@pytest.fixture(scope="module")
def new_process_exports(request, tmp_path_factory):
    """The cases this run selected, each exported once and saved: (backend, kind) -> (model, export), or the error
    of a failed export, kept for its test to raise. The in-process tests below reuse the dynamo exports."""
    workdir = tmp_path_factory.mktemp("image-text-new-process")
    exports = {}
    for backend, kind in sorted(selected_params(request, "test_generate_equals_eager_in_a_new_process", "backend",
                                                "kind"), key=lambda case: (case[0] != "onnx", case)):
        # ONNX first: the process's first load
        try:
            exports[backend, kind] = export_case(backend, kind, workdir / f"{backend}-{kind}")
        except Exception as error:  # noqa: BLE001 - re-raised by the case's test
            exports[backend, kind] = error
    return workdir, exports


@pytest.fixture(scope="module")
def new_process_runs(new_process_exports):
    """Those cases all generated in one new process."""
    workdir, exports = new_process_exports
    models, runs = {}, {}
    for (backend, kind), value in exports.items():
        models[backend, kind] = value if isinstance(value, Exception) else value[0]
        if not isinstance(value, Exception):
            ids, mask, media = case_inputs(kind)
            runs[f"{backend}-{kind}"] = (workdir / f"{backend}-{kind}", [(ids, mask)],
                                         {**media, "max_new_tokens": NEW_TOKENS})
    return models, generate_in_fresh_process(runs, workdir) if runs else {}


def dynamo_export(new_process_exports, kind: str, tmp_path_factory) -> tuple[torch.nn.Module, hfexport.ExportedModel]:
    """The dynamo export of the new-process case where this run made it, else the same export made here (the
    tests that take it only read it and generate with it)."""
    exported = new_process_exports[1].get(("dynamo", kind))
    if exported is None:
        return export_case("dynamo", kind, tmp_path_factory.mktemp(kind) / "artifact")
    if isinstance(exported, Exception):
        raise exported
    return exported


@pytest.mark.parametrize("backend,kind", CASES)
def test_generate_equals_eager_in_a_new_process(backend, kind, new_process_runs):
    models, results = new_process_runs
    model = models[backend, kind]
    if isinstance(model, Exception):
        raise model
    ids, mask, media = case_inputs(kind)
    expected = eager_generate(model, ids, mask, **media)
    (got,) = results[f"{backend}-{kind}"]
    assert got.shape == expected.shape == (2, ids.shape[1] + NEW_TOKENS)
    assert torch.equal(got, expected), f"first difference at {(got != expected).nonzero()[:1].tolist()}"


@pytest.mark.parametrize("kind", KINDS)
def test_the_images_change_the_tokens_that_the_test_compares(kind):
    """The new-process check above would pass with the images ignored if they did not matter: they do, in each
    row, and the new tokens are not one token repeated."""
    model = vlm(kind)
    ids, mask, media = case_inputs(kind)
    expected = eager_generate(model, ids, mask, **media)
    changed = eager_generate(model, ids, mask, **case_inputs(kind, other_images=True)[2])
    assert all(not torch.equal(a, b) for a, b in zip(expected, changed, strict=True))
    assert all(len(set(row[ids.shape[1]:].tolist())) >= 5 for row in expected)


def test_gemma3_images_attend_both_ways_and_that_changes_the_tokens():
    """Gemma 3's image tokens attend to their whole image (token_type_ids); without, eager's ids differ: the
    exported decoder's image_blocks mask is what the new-process check above compares."""
    model = vlm("gemma3")
    ids, mask, media = case_inputs("gemma3")
    causal_only = {k: v for k, v in media.items() if k != "token_type_ids"}
    both_ways, causal = eager_generate(model, ids, mask, **media), eager_generate(model, ids, mask, **causal_only)
    assert all(not torch.equal(a, b) for a, b in zip(both_ways, causal, strict=True))  # in each row


@pytest.fixture(scope="module")
def llava_dynamo(new_process_exports, tmp_path_factory):
    return dynamo_export(new_process_exports, "llava", tmp_path_factory)


def test_the_manifest_records_the_programs_and_the_image_size(llava_dynamo, tmp_path):
    _, exported = llava_dynamo
    exported.save_pretrained(tmp_path / "a")
    manifest = json.loads((tmp_path / "a" / "export.json").read_text())
    assert manifest["task"] == "image-text-to-text"
    assert list(manifest["components"]) == ["vision", "embed", "decoder"]
    vision = manifest["generation"]["vision"]
    assert vision == {"inputs": ["pixel_values"], "pixel_values_shape": [3, 32, 32], "per_row": False,
                      "token_types": False, "image_size": [32, 32], "dtype": "float32", "image_token_id": IMAGE_TOKEN, "tokens_per_image": TOKENS_PER_IMAGE,
                      "max_images": 2}
    inputs = {c: [i["name"] for i in manifest["components"][c]["inputs"]] for c in manifest["components"]}
    assert inputs == {"vision": ["pixel_values"], "embed": ["input_ids"],
                      "decoder": ["inputs_embeds", "attention_mask", "position_ids", "past_length", "cache"]}
    pixels = manifest["components"]["vision"]["inputs"][0]
    assert pixels["dynamic_dims"]["0"]["max"] == 2 and set(pixels["dynamic_dims"]) == {"0"}  # images; size static
    assert manifest["generation"]["max_cache_len"] == 48


def test_each_program_holds_only_the_weights_it_reads(llava_dynamo):
    """torch.export keeps every parameter of the module it traces: the programs wrap only their own parts."""
    _, exported = llava_dynamo
    weights = {name: {re.sub(r"^(model\.)+", "", k) for k in exported.components[name].runner.program.state_dict}
               for name in ("vision", "embed", "decoder")}
    assert weights["vision"] and all(k.startswith(("vision_tower.", "multi_modal_projector.")) for k in weights["vision"])
    assert weights["embed"] == {"embed_tokens.weight"}
    assert "lm_head.weight" in weights["decoder"]
    assert not any("embed_tokens" in k for k in weights["decoder"])  # the embed program's
    assert not any(k.startswith(("vision_tower.", "multi_modal_projector.")) for k in weights["decoder"])


def test_a_prompt_without_images_generates_as_eager(llava_dynamo):
    model, exported = llava_dynamo
    ids = torch.randint(3, 90, (1, 9), generator=torch.Generator().manual_seed(4))
    assert torch.equal(exported.generate(ids, max_new_tokens=NEW_TOKENS),
                       eager_generate(model, ids, torch.ones_like(ids)))


def test_another_image_size_is_refused_by_name_before_any_program_runs(llava_dynamo):
    _, exported = llava_dynamo
    ids, mask, _ = batch_with_images()
    with pytest.raises(ValueError, match=r"images of \[3, 48, 48\]; this export takes \[images, 3, 32, 32\] "
                                         r"\(its image size, 32x32"):
        exported.generate(ids, mask, pixel_values=torch.zeros(2, 3, 48, 48), max_new_tokens=2)
    with pytest.raises(ValueError, match="pixel_values"):
        exported.run("vision", pixel_values=torch.zeros(2, 3, 48, 48))


@pytest.mark.parametrize("change,message", [
    (lambda ids, px: (ids, px[:1]), r"32 image tokens \(id 99\) for 1 image\(s\) of 16 tokens each"),
    (lambda ids, px: (ids, torch.cat([px, px])), "4 images exceed this export's max_images=2"),
    (lambda ids, px: (ids, px.long()), "pixel_values must be a float tensor"),
])
def test_images_that_do_not_fit_the_prompt_or_the_export_are_refused(llava_dynamo, change, message):
    _, exported = llava_dynamo
    ids, mask, pixel_values = batch_with_images()
    ids, pixel_values = change(ids, pixel_values)
    with pytest.raises((ValueError, TypeError), match=message):
        exported.generate(ids, mask, pixel_values=pixel_values, max_new_tokens=2)


def test_an_image_count_the_manifest_says_is_static_is_refused_by_name(llava_dynamo):
    """Where the vision program's images dim is static (a count fixed at trace time), generate refuses another
    count before any program runs; the same export's manifest with the dim dynamic takes it."""
    import copy

    _, exported = llava_dynamo
    saved = copy.deepcopy(exported.manifest)
    ids, mask, pixel_values = batch_with_images()
    try:
        pixels = exported.manifest["components"]["vision"]["inputs"][0]
        pixels["dynamic_dims"], pixels["shape"][0] = {}, 1  # as if traced at one image, the count static
        with pytest.raises(ValueError, match=r"2 images: this export's vision program takes exactly 1 per call \(its "
                                             r"manifest's pixel_values dim 0 is static"):
            exported.generate(ids, mask, pixel_values=pixel_values, max_new_tokens=2)
    finally:
        exported.manifest.clear()
        exported.manifest.update(saved)
    assert exported.generate(ids, mask, pixel_values=pixel_values, max_new_tokens=2).shape == (2, ids.shape[1] + 2)


def test_a_model_of_another_family_or_task_says_what_to_do():
    with pytest.raises(hfexport.InvalidInputError, match="export its language model with task='text-generation'"):
        hfexport.export(tiny_model("llama"), backend="dynamo", task="image-text-to-text")
    with pytest.raises(TypeError, match=r"'max_images': not an option of backend 'dynamo' \(DynamoConfig: .*\) nor "
                                        r"of task 'text-generation' \(GenerationOptions: max_cache_len, max_batch, "
                                        r"prefill_chunk\)"):
        hfexport.export(tiny_model("llama"), backend="dynamo", task="text-generation", max_images=2)


def test_smolvlm_images_with_masked_pixels_or_without_their_row_dim_are_refused(new_process_exports,
                                                                               tmp_path_factory):
    """Idefics3/SmolVLM take the processor's ``[batch, images, C, H, W]``; the export encodes whole images only."""
    _, exported = dynamo_export(new_process_exports, "smolvlm", tmp_path_factory)
    ids, mask, media = smolvlm_batch()
    media["pixel_attention_mask"][0, 0, :, 16:] = False  # the right half of a real image
    with pytest.raises(ValueError, match="pixel_attention_mask hides pixels of an image"):
        exported.generate(ids, mask, **media, max_new_tokens=2)
    with pytest.raises(TypeError, match=r"pixel_values must be a float tensor \[batch, images, 3, 32, 32\]"):
        exported.generate(ids, mask, pixel_values=media["pixel_values"][0], max_new_tokens=2)


@pytest.mark.slow
def test_executorch_at_max_batch_1_attends_with_its_fused_kernel_over_a_row_without_its_padding():
    """At max_batch=1 ExecuTorch's decoder attends with llama::custom_sdpa, without a padding mask: generate drops a
    row's left padding from its ids and from the merged embeddings alike."""
    model = tiny_model("llava")
    exported = hfexport.export(model, backend="executorch-xnnpack", task="image-text-to-text", max_cache_len=48)
    assert exported.manifest["generation"]["cache"]["ignores_padding"] is True
    ids, mask, pixel_values = batch_with_images()
    ids, mask, pixel_values = ids[1:], mask[1:], pixel_values[1:]  # the row left-padded by 3
    assert torch.equal(exported.generate(ids, mask, pixel_values=pixel_values, max_new_tokens=NEW_TOKENS),
                       eager_generate(model, ids, mask, pixel_values=pixel_values))


# ── Qwen2-VL: packed patches at one grid, 3-D RoPE positions ─────────────────────────────────────────────
@pytest.fixture(scope="module")
def qwen2vl_dynamo(new_process_exports, tmp_path_factory):
    return dynamo_export(new_process_exports, "qwen2vl", tmp_path_factory)


@pytest.mark.parametrize("layout", ["two images, left padding", "ends with an image", "no image"])
def test_qwen2vl_rope_positions_are_the_models_get_rope_index(layout):
    from hfexport_dynamo.tasks.image_prompt import rope_positions

    model = tiny_model("qwen2vl")
    ids, mask, media = qwen2vl_batch()
    if layout == "ends with an image":
        ids[1, -4:] = IMAGE_TOKEN  # a second image, the last 4 positions
    if layout == "no image":
        ids[ids == IMAGE_TOKEN] = 5
    images = int((ids == IMAGE_TOKEN).sum()) // 4
    expected, _ = model.model.get_rope_index(ids, (ids == IMAGE_TOKEN).int(), attention_mask=mask,
                                             image_grid_thw=torch.tensor([[1, 4, 4]] * images) if images else None)
    got = rope_positions(ids, mask, IMAGE_TOKEN, [1, 4, 4], 2)
    assert torch.equal(got, expected)
    if images:  # the 3-D positions differ from the 1-D ones the text decoders count: the test would see a mix-up
        assert not torch.equal(got, got[:1].expand(3, -1, -1))


def test_qwen2vl_manifest_and_vision_program_at_its_static_grid(qwen2vl_dynamo):
    model, exported = qwen2vl_dynamo
    vision = exported.manifest["generation"]["vision"]
    assert (vision["pixel_values_shape"], vision["grid_thw"], vision["image_size"], vision["tokens_per_image"]) == \
        ([16, 96], [1, 4, 4], [16, 16], 4)
    decoder = {i["name"]: i for i in exported.manifest["components"]["decoder"]["inputs"]}
    assert decoder["position_ids"]["shape"][0] == 3
    _, _, media = qwen2vl_batch()
    for images in (1, 3):  # the number of images is dynamic; each is attended over alone (as eager splits them)
        patches = media["pixel_values"][:16 * images]
        with torch.no_grad():
            expected = torch.cat(model.model.get_image_features(patches, media["image_grid_thw"][:images]).pooler_output)
        got = exported.run("vision", pixel_values=patches.reshape(images, 16, 96))["image_embeds"]
        torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("change,error,message", [
    (lambda ids, m: {**m, "image_grid_thw": torch.tensor([[1, 6, 6]] * 3)}, ValueError,
     r"image_grid_thw holds \[\(1, 6, 6\)\]; this export takes images of the grid \[1, 4, 4\] \(16x16 pixels\)"),
    (lambda ids, m: {k: v for k, v in m.items() if k != "image_grid_thw"}, ValueError, "need their image_grid_thw"),
    (lambda ids, m: {**m, "pixel_values": m["pixel_values"].reshape(3, 16, 96)}, TypeError,
     r"pixel_values must be a float tensor \[images \* 16, 96\]"),
    (lambda ids, m: {**m, "mm_token_type_ids": torch.zeros_like(ids)}, ValueError,
     "mm_token_type_ids must be 1 exactly at the image tokens"),
])
def test_qwen2vl_images_of_another_grid_or_without_it_are_refused_by_name(qwen2vl_dynamo, change, error, message):
    _, exported = qwen2vl_dynamo
    ids, mask, media = qwen2vl_batch()
    with pytest.raises(error, match=message):
        exported.generate(ids, mask, **change(ids, media), max_new_tokens=2)


def test_qwen2vl_export_check_of_the_cli_generates_with_packed_patches(qwen2vl_dynamo):
    """``hfexport export --task image-text-to-text``'s generation check: one seeded image per row, as the processor
    gives them (packed patches, ``image_grid_thw``, ``mm_token_type_ids``), against eager."""
    from hfexport_dynamo.tasks.export_command import _generation_check

    model, exported = qwen2vl_dynamo
    check = _generation_check(model, exported)
    assert check["report"]["passed"], check["text"]
    assert check["report"]["inputs"]["pixel_values"] == [2 * 16, 96]
    assert check["report"]["inputs"]["image_grid_thw"] == [2, 3]


def test_qwen2vl_two_images_in_one_run_of_tokens_are_refused():
    """Without a token between them, the model's own get_rope_index takes two images' tokens for one image."""
    from hfexport_dynamo.tasks.image_prompt import rope_positions

    ids, mask, _ = qwen2vl_batch()
    ids[0, 6:8] = IMAGE_TOKEN  # the two images' runs of tokens now touch: one run of 10
    with pytest.raises(ValueError, match="a run of 10 image tokens .* in row 0: each image is one run of 4"):
        rope_positions(ids, mask, IMAGE_TOKEN, [1, 4, 4], 2)


def test_qwen2vl_vision_attention_without_its_patch_does_not_export():
    """``_patch_qwen_vl_vision_segments``: the model splits the packed patches per image on ``.tolist()``."""
    with pytest.raises(hfexport.ExportError, match="(?i)data.dependent|GuardOnDataDependentSymNode|unbacked"):
        hfexport.export(tiny_model("qwen2vl"), backend="dynamo", task="image-text-to-text", max_batch=2,
                        disable=("_patch_qwen_vl_vision_segments",))
