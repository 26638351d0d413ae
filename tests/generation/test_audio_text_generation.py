"""Audio-language models exported for ``task="audio-text-to-text"`` (issue 28): Voxtral's ``audio``, ``embed`` and
``decoder`` programs, and greedy ``generate(input_ids, attention_mask, input_features=...)`` that merges the audio
embeddings at the audio tokens as the model's forward does, with exactly eager ``model.generate(do_sample=False)``'s
token ids, after ``save_pretrained`` and ``hfexport.load`` in a new process; a left-padded batch of two prompts, the
first with two audio chunks. Bad audio is refused by name before any program runs."""

from __future__ import annotations

from typing import Any

import pytest
import torch

import hfexport
from helpers import generate_in_fresh_process, selected_params, tiny_model

NEW_TOKENS = 20
AUDIO_TOKEN, TOKENS_PER_CHUNK = 99, 4  # the tiny Voxtral's: 32 frames -> 16 positions, stacked by 4
BACKENDS = [pytest.param("dynamo", id="dynamo"), pytest.param("onnx", id="onnx", marks=pytest.mark.slow),
            pytest.param("executorch-xnnpack", id="executorch-xnnpack", marks=pytest.mark.slow)]


def audio_batch(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, dict[str, Any]]:
    """Two prompts of 16 positions, the second left-padded by 3; the first holds two chunks' audio tokens, the
    second one; three seeded chunks of log-mel features ``[3, 16, 32]`` (rows' chunks in order), with the
    repetition penalty and bigram ban of the image tests (the tiny decoder otherwise repeats a few tokens)."""
    ids = torch.randint(3, 90, (2, 16), generator=torch.Generator().manual_seed(4))
    ids[0, 2:6] = ids[0, 8:12] = ids[1, 5:9] = AUDIO_TOKEN
    mask = torch.ones_like(ids)
    ids[1, :3], mask[1, :3] = 0, 0
    features = torch.randn(3, 16, 32, generator=torch.Generator().manual_seed(seed))
    return ids, mask, {"input_features": features, "repetition_penalty": 1.5, "no_repeat_ngram_size": 2}


def eager_generate(model: torch.nn.Module, ids: torch.Tensor, mask: torch.Tensor, **options) -> torch.Tensor:
    with torch.no_grad():
        return model.generate(input_ids=ids, attention_mask=mask, do_sample=False,
                              **{"max_new_tokens": NEW_TOKENS, **options})


def export_and_save(model: torch.nn.Module, backend: str, directory) -> hfexport.ExportedModel:
    """``max_batch=3``, ``max_cache_len=40`` (the 16-position prompts and their 20 new tokens fit)."""
    exported = hfexport.export(model, backend=backend, task="audio-text-to-text", max_batch=3, max_cache_len=40)
    exported.save_pretrained(directory)
    return exported


@pytest.fixture(scope="module")
def new_process_exports(request, tmp_path_factory):
    """The backends this run selected, each exported once and saved: (model, backend -> export or the error of a
    failed export, kept for its test to raise). The in-process tests below reuse the dynamo export."""
    workdir = tmp_path_factory.mktemp("audio-text-new-process")
    model, exports = tiny_model("voxtral"), {}
    for (backend,) in selected_params(request, "test_generate_equals_eager_in_a_new_process", "backend"):
        try:
            exports[backend] = export_and_save(model, backend, workdir / backend)
        except Exception as error:  # noqa: BLE001 - re-raised by the case's test
            exports[backend] = error
    return workdir, model, exports


@pytest.fixture(scope="module")
def new_process_runs(new_process_exports):
    """Those exports all generated in one new process."""
    workdir, model, exports = new_process_exports
    ids, mask, media = audio_batch()
    errors = {backend: value for backend, value in exports.items() if isinstance(value, Exception)}
    runs = {backend: (workdir / backend, [(ids, mask)], {**media, "max_new_tokens": NEW_TOKENS})
            for backend in exports if backend not in errors}
    return model, errors, generate_in_fresh_process(runs, workdir) if runs else {}


@pytest.mark.parametrize("backend", BACKENDS)
def test_generate_equals_eager_in_a_new_process(backend, new_process_runs):
    model, errors, results = new_process_runs
    if backend in errors:
        raise errors[backend]
    ids, mask, media = audio_batch()
    expected = eager_generate(model, ids, mask, **media)
    (got,) = results[backend]
    assert got.shape == expected.shape == (2, ids.shape[1] + NEW_TOKENS)
    assert torch.equal(got, expected), f"first difference at {(got != expected).nonzero()[:1].tolist()}"


def test_the_audio_changes_the_tokens_that_the_test_compares():
    model = tiny_model("voxtral")
    ids, mask, media = audio_batch()
    expected = eager_generate(model, ids, mask, **media)
    changed = eager_generate(model, ids, mask, **audio_batch(seed=5)[2])
    assert all(not torch.equal(a, b) for a, b in zip(expected, changed, strict=True))  # in each row
    assert all(len(set(row[ids.shape[1]:].tolist())) >= 5 for row in expected)


@pytest.fixture(scope="module")
def voxtral_dynamo(new_process_exports, tmp_path_factory):
    """The new-process test's dynamo export where this run made it, else the same export made here (the tests
    that take it only read it and generate with it)."""
    _, model, exports = new_process_exports
    exported = exports.get("dynamo")
    if exported is None:
        model = tiny_model("voxtral")
        exported = export_and_save(model, "dynamo", tmp_path_factory.mktemp("voxtral") / "artifact")
    if isinstance(exported, Exception):
        raise exported
    return model, exported


def test_the_manifest_records_the_programs_and_the_chunk_shape(voxtral_dynamo):
    _, exported = voxtral_dynamo
    manifest = exported.manifest
    assert manifest["task"] == "audio-text-to-text"
    assert list(manifest["components"]) == ["audio", "embed", "decoder"]
    assert manifest["generation"]["audio"] == {"inputs": ["input_features"], "input_features_shape": [16, 32],
                                               "dtype": "float32", "audio_token_id": AUDIO_TOKEN,
                                               "tokens_per_chunk": TOKENS_PER_CHUNK, "max_audio_chunks": 3}
    features = manifest["components"]["audio"]["inputs"][0]
    assert features["name"] == "input_features" and set(features["dynamic_dims"]) == {"0"}  # chunks; shape static


@pytest.mark.parametrize("change,error,message", [
    (lambda m: {**m, "input_features": m["input_features"][:, :, :16]}, ValueError,
     r"input_features has chunks of \[16, 16\]; this export takes \[chunks, 16, 32\]"),
    (lambda m: {**m, "input_features": m["input_features"][:2]}, ValueError,
     r"input_ids hold 12 audio tokens \(id 99\) for 2 chunk\(s\) of 4 tokens each"),
    (lambda m: {**m, "input_features": torch.cat([m["input_features"]] * 2)}, ValueError,
     "6 audio chunks exceed this export's max_audio_chunks=3"),
    (lambda m: {**m, "input_features": m["input_features"].long()}, TypeError, "input_features must be a float"),
])
def test_audio_that_does_not_fit_the_prompt_or_the_export_is_refused(voxtral_dynamo, change, error, message):
    _, exported = voxtral_dynamo
    ids, mask, media = audio_batch()
    with pytest.raises(error, match=message):
        exported.generate(ids, mask, **change(media), max_new_tokens=2)


def test_a_model_of_another_modality_says_what_to_do():
    with pytest.raises(hfexport.InvalidInputError, match="merges audio embeddings for VoxtralForConditionalGeneration"):
        hfexport.export(tiny_model("llava"), backend="dynamo", task="audio-text-to-text")
    with pytest.raises(TypeError, match=r"'max_images': not an option of backend 'dynamo' .* nor of task "
                                        r"'audio-text-to-text' \(GenerationOptions: max_cache_len, max_batch, prefill_chunk\)"):
        hfexport.export(tiny_model("voxtral"), backend="dynamo", task="audio-text-to-text", max_images=2)
