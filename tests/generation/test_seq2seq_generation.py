"""Encoder-decoders exported for ``task="text2text-generation"`` (T5, BART) and ``"automatic-speech-recognition"``
(Whisper): greedy ``generate`` over the exported ``encoder``, ``prefill`` and ``decode`` programs returns exactly
eager ``model.generate(do_sample=False)``'s ids, on every backend, after ``save_pretrained`` and ``hfexport.load``
in a new process; Whisper's init tokens (language detection, language and task, ``no_timestamps``) and its
suppress-token processors; and bad input is refused before any program runs.

The tiny models' weights are drawn larger than their configs' default (``init_std``, T5's ``initializer_factor``,
and T5's seed): with the default, greedy decoding repeats one token from the first step on (or ends at once), and
a decode step that ignored its cache would still match eager.
"""

from __future__ import annotations

import json

import pytest
import torch

import hfexport
from helpers import generate_in_fresh_process, selected_params, tiny_model

NEW_TOKENS = 20
TEXT2TEXT, SPEECH = "text2text-generation", "automatic-speech-recognition"
KINDS = ["t5", "bart", "whisper"]
LIVELY = {"t5": dict(initializer_factor=5.0, seed=2), "bart": dict(init_std=1.0), "whisper": dict(init_std=0.5)}
# (backend, kind) pairs of the development loop; the rest run with -m slow.
QUICK = {("dynamo", kind) for kind in KINDS} | {("onnx", "bart")}
CASES = [pytest.param(backend, kind, marks=() if (backend, kind) in QUICK else pytest.mark.slow,
                      id=f"{backend}-{kind}")
         for backend in ("dynamo", "onnx", "executorch-xnnpack") for kind in KINDS]


def lively(kind: str, **overrides) -> torch.nn.Module:
    return tiny_model(kind, **{**LIVELY[kind], **overrides})


def task_of(kind: str) -> str:
    return SPEECH if kind == "whisper" else TEXT2TEXT


def features(batch: int, seed: int) -> torch.Tensor:
    """Whisper's log-mel input of the tiny config: 16 mels, 32 frames (2 * max_source_positions)."""
    return torch.randn(batch, 16, 32, generator=torch.Generator().manual_seed(seed))


def inputs(kind: str) -> list[tuple[torch.Tensor, torch.Tensor | None]]:
    """Two lengths at batch 1 and a batch of two whose second row is padded (text: right-padded by 3 as a T5 or
    BART tokenizer pads; speech: two different feature sets, as Whisper's features have one length)."""
    if kind == "whisper":
        return [(features(1, 0), None), (features(1, 1), None), (features(2, 9), None)]

    def ids(batch: int, length: int, seed: int) -> torch.Tensor:
        return torch.randint(3, 100, (batch, length), generator=torch.Generator().manual_seed(seed))

    padded, mask = ids(2, 9, 2), torch.ones(2, 9, dtype=torch.long)
    padded[1, -3:], mask[1, -3:] = 0, 0
    return [(ids(1, 4, 0), None), (ids(1, 11, 1), None), (padded, mask)]


def eager_generate(model: torch.nn.Module, x: torch.Tensor, mask: torch.Tensor | None, **options) -> torch.Tensor:
    options = {"max_new_tokens": NEW_TOKENS, "do_sample": False, **options}
    with torch.no_grad():
        if model.main_input_name == "input_features":
            return model.generate(x, **options)
        return model.generate(input_ids=x, attention_mask=mask, **options)


def assert_same_ids(got: torch.Tensor, expected: torch.Tensor, what: object) -> None:
    assert got.shape == expected.shape, (what, got.tolist(), expected.tolist())
    first = (got != expected).nonzero()
    assert torch.equal(got, expected), f"{what}: first difference at {first[:1].tolist()}"


def export_and_save(backend: str, kind: str, directory) -> tuple[torch.nn.Module, hfexport.ExportedModel]:
    model = lively(kind)
    exported = hfexport.export(model, backend=backend, task=task_of(kind), max_cache_len=24, max_batch=2)
    exported.save_pretrained(directory)
    return model, exported


@pytest.fixture(scope="module")
def new_process_exports(request, tmp_path_factory):
    """The cases of the new-process test this run selected (the development loop's four; all nine in the full
    suite) exported and saved: (backend, kind) -> (model, export), or the error of a failed export, kept for its
    test to raise. The in-process tests below reuse the dynamo BART and Whisper."""
    workdir = tmp_path_factory.mktemp("seq2seq-new-process")
    cases = selected_params(request, "test_generate_equals_eager_in_a_new_process", "backend", "kind")
    exports = {}
    for backend, kind in sorted(cases, key=lambda case: (case[0] != "onnx", case)):
        # ONNX first: its load is the process's first (hfexport_dynamo and transformers not imported yet)
        try:
            exports[backend, kind] = export_and_save(backend, kind, workdir / f"{backend}-{kind}")
        except Exception as error:  # noqa: BLE001 - re-raised by the case's test
            exports[backend, kind] = error
    return workdir, exports


@pytest.fixture(scope="module")
def new_process_runs(new_process_exports):
    """Those cases generated in one new process (starting one and loading hfexport, transformers and a backend
    costs about 10 s, once instead of once per case)."""
    workdir, exports = new_process_exports
    models = {case: value if isinstance(value, Exception) else value[0] for case, value in exports.items()}
    runs = {f"{backend}-{kind}": (workdir / f"{backend}-{kind}", inputs(kind), {"max_new_tokens": NEW_TOKENS})
            for (backend, kind), value in exports.items() if not isinstance(value, Exception)}
    return models, generate_in_fresh_process(runs, workdir) if runs else {}


@pytest.mark.parametrize("backend,kind", CASES)
def test_generate_equals_eager_in_a_new_process(backend, kind, new_process_runs):
    models, results = new_process_runs
    model = models[backend, kind]
    if isinstance(model, Exception):
        raise model
    got = results[f"{backend}-{kind}"]
    for (x, mask), ids in zip(inputs(kind), got, strict=True):
        assert_same_ids(ids, eager_generate(model, x, mask), list(x.shape))


# ── in process, on dynamo ───────────────────────────────────────────────────────────────────────────────
def dynamo_export(new_process_exports, kind: str, tmp_path_factory) -> tuple[torch.nn.Module, hfexport.ExportedModel]:
    """The dynamo export of the new-process case (max_cache_len=24, max_batch=2) where this run made it, else the
    same export made here."""
    exported = new_process_exports[1].get(("dynamo", kind))
    if exported is None:
        return export_and_save("dynamo", kind, tmp_path_factory.mktemp(kind) / "artifact")
    if isinstance(exported, Exception):
        raise exported
    return exported


@pytest.fixture(scope="module")
def bart(new_process_exports, tmp_path_factory):
    return dynamo_export(new_process_exports, "bart", tmp_path_factory)


@pytest.fixture(scope="module")
def whisper(new_process_exports, tmp_path_factory):
    return dynamo_export(new_process_exports, "whisper", tmp_path_factory)


def test_the_result_has_the_start_token_and_pads_a_row_after_its_eos(bart):
    model, exported = bart
    x, mask = inputs("bart")[2]
    free = eager_generate(model, x, mask, forced_eos_token_id=None)
    # an EOS id that ends the second row early and never comes in the first
    first_row = set(free[0, 1:].tolist())
    end = next(i for i in range(1, free.shape[1]) if int(free[1, i]) not in first_row)
    eos = int(free[1, end])
    expected = eager_generate(model, x, mask, eos_token_id=eos, forced_eos_token_id=None)
    got = exported.generate(x, mask, max_new_tokens=NEW_TOKENS, eos_token_id=eos, forced_eos_token_id=None)
    assert_same_ids(got, expected, "eos")
    assert (got[:, 0] == model.generation_config.decoder_start_token_id).all()
    assert got.shape[1] == free.shape[1] and (got[1, end + 1:] == model.generation_config.pad_token_id).all()
    stats = exported.generation_stats
    assert stats["new_tokens"] == got.shape[1] - 1 and stats["decode_steps"] == got.shape[1] - 2
    assert stats["encoder_s"] > 0 and stats["prefill_s"] > 0 and stats["decode_s"] > 0


def test_generation_options_go_through_transformers_logits_processors(bart):
    model, exported = bart
    x, mask = inputs("bart")[2]
    # forced_eos_token_id (BART's config) reads max_length; min_new_tokens reads the EOS ids; the encoder's ids
    # reach encoder_repetition_penalty
    options = {"repetition_penalty": 1.5, "no_repeat_ngram_size": 2, "min_new_tokens": 8,
               "encoder_repetition_penalty": 1.3, "max_new_tokens": 12}
    expected = eager_generate(model, x, mask, **options)
    assert_same_ids(exported.generate(x, mask, **options), expected, options)
    assert int(expected[0, -1]) == model.generation_config.forced_eos_token_id  # forced at max_length
    options = {"decoder_start_token_id": 5, "forced_eos_token_id": None}
    expected = eager_generate(model, x, mask, **options)
    assert_same_ids(exported.generate(x, mask, max_new_tokens=NEW_TOKENS, **options), expected, options)
    assert (expected[:, 0] == 5).all()


def test_whisper_returns_the_new_ids_without_eos_and_right_pads_as_its_generate_does(whisper):
    model, exported = whisper
    x = features(2, 9)
    expected = eager_generate(model, x, None)
    got = exported.generate(x, max_new_tokens=NEW_TOKENS)
    assert_same_ids(got, expected, "whisper")
    # the first row ends with EOS (2) after 9 tokens: Whisper's generate drops it and pads with pad_token_id (0)
    assert (got[0, 9:] == 0).all() and 2 not in got[0].tolist() and got.shape == (2, NEW_TOKENS)


def multilingual_whisper() -> torch.nn.Module:
    """The tiny Whisper with a multilingual generation config: language and task tokens, ``<|notimestamps|>``,
    suppressed tokens (always, and at the first generated position)."""
    model = lively("whisper")
    config = model.generation_config
    config.lang_to_id = {"<|en|>": 90, "<|fr|>": 91, "<|de|>": 92}
    config.task_to_id = {"transcribe": 93, "translate": 94}
    config.no_timestamps_token_id = 95
    config.is_multilingual = True
    config.suppress_tokens = [85, 33]
    config.begin_suppress_tokens = [83, 2]
    return model


def test_whisper_init_tokens_language_detection_and_suppressed_tokens_match_eager(tmp_path):
    model = multilingual_whisper()
    exported = hfexport.export(model, backend="dynamo", task=SPEECH, max_cache_len=28, max_batch=2)
    x = features(2, 9)
    for options in ({}, {"language": "fr"}, {"language": "german", "task": "translate"}):
        expected = eager_generate(model, x, None, **options)
        assert_same_ids(exported.generate(x, max_new_tokens=NEW_TOKENS, **options), expected, options)
        detected = exported.generation_stats.get("language_ids")
        if options:
            assert detected is None
        else:  # as WhisperGenerationMixin.detect_language detects them
            expected_ids = model.detect_language(x, generation_config=model.generation_config, num_segment_frames=32)
            assert detected == expected_ids.tolist()
    with pytest.raises(ValueError, match="language 'xx' is not in the generation config's lang_to_id"):
        exported.generate(x, max_new_tokens=2, language="xx")


def test_the_manifest_records_the_components_and_bounds(bart, tmp_path):
    _, exported = bart
    exported.save_pretrained(tmp_path / "a")
    manifest = json.loads((tmp_path / "a" / "export.json").read_text())
    assert manifest["task"] == TEXT2TEXT
    assert list(manifest["components"]) == ["encoder", "prefill", "decode"]
    assert {"encoder/model.pt2", "prefill/model.pt2", "decode/model.pt2", "config.json"} <= set(manifest["files"])
    generation = manifest["generation"]
    assert (generation["max_cache_len"], generation["max_batch"], generation["max_source_len"]) == (24, 2, 64)
    assert (generation["decoder_start_token_id"], generation["encoder_input"]) == (2, "input_ids")
    inputs_of = {name: {i["name"]: i for i in manifest["components"][name]["inputs"]}
                 for name in manifest["components"]}
    assert list(inputs_of["encoder"]) == ["input_ids", "attention_mask"]
    assert list(inputs_of["prefill"]) == ["decoder_input_ids", "encoder_hidden_states", "attention_mask"]
    decode = inputs_of["decode"]
    assert list(decode) == ["decoder_input_ids", "encoder_hidden_states", "attention_mask", "cache", "cross_cache"]
    assert decode["attention_mask"]["dynamic_dims"]["1"]["max"] == 64
    assert decode["encoder_hidden_states"]["dynamic_dims"]["0"]["max"] == 2
    outputs = [o["name"] for o in manifest["components"]["prefill"]["outputs"]]
    assert outputs[0] == "logits" and any(o.startswith("cross_cache") for o in outputs)


# ── bad input ───────────────────────────────────────────────────────────────────────────────────────────
def refuse_to_run(exported, monkeypatch):
    def run(*args, **kwargs):
        raise AssertionError("a program ran")

    monkeypatch.setattr(exported, "run", run)


@pytest.mark.parametrize("x,options,error,message", [
    (torch.ones(1, 16, 32, dtype=torch.long), {}, TypeError, r"input_features must be a float tensor \[batch, 16, 32\]"),
    (torch.ones(16, 32), {}, TypeError, r"of shape \[16, 32\]"),
    (torch.ones(1, 16, 64), {}, ValueError, r"shape \[1, 16, 64\]; this export takes \[batch, 16, 32\] \(long-form"),
    (torch.ones(1, 80, 32), {}, ValueError, r"this export takes \[batch, 16, 32\]$"),
    (torch.ones(3, 16, 32), {}, ValueError, "batch of 3 exceeds this export's max_batch=2"),
    (torch.ones(1, 16, 32), {"max_new_tokens": 24}, ValueError,
     r"an init sequence of 1 tokens plus max_new_tokens=24 exceeds this export's max_cache_len=24"),
    (torch.ones(1, 16, 32), {"return_timestamps": True}, ValueError, "without timestamps: return_timestamps=True"),
    (torch.ones(1, 16, 32), {"language": "en"}, ValueError, "not in the generation config's lang_to_id"),
    (torch.ones(1, 16, 32), {"temperatur": 0.5}, TypeError, "unknown generation option"),
])
def test_bad_speech_input_is_refused_before_any_program_runs(whisper, monkeypatch, x, options, error, message):
    _, exported = whisper
    refuse_to_run(exported, monkeypatch)
    with pytest.raises(error, match=message):
        exported.generate(x, **{"max_new_tokens": 4, **options})


@pytest.mark.parametrize("x,mask,options,error,message", [
    (torch.ones(1, 5), None, {}, TypeError, "input_ids must be an integer tensor"),
    (torch.ones(3, 5, dtype=torch.long), None, {}, ValueError, "batch of 3 exceeds this export's max_batch=2"),
    (torch.ones(1, 65, dtype=torch.long), None, {}, ValueError, "65 tokens: this export's encoder takes 1 to "
                                                                  "max_source_len=64"),
    (torch.ones(1, 5, dtype=torch.long), None, {"max_new_tokens": 24}, ValueError,
     r"a decoder start of 1 tokens plus max_new_tokens=24 exceeds this export's max_cache_len=24: .* >= 25"),
    (torch.ones(1, 5, dtype=torch.long), torch.ones(1, 4), {}, ValueError, r"attention_mask has shape \[1, 4\]"),
    (torch.full((1, 5), 100), None, {}, ValueError, r"ids outside the vocabulary \[0, 100\)"),
    (torch.ones(1, 5, dtype=torch.long), None, {"num_beams": 2}, ValueError, "generates greedily"),
])
def test_bad_text_input_is_refused_before_any_program_runs(bart, monkeypatch, x, mask, options, error, message):
    _, exported = bart
    refuse_to_run(exported, monkeypatch)
    with pytest.raises(error, match=message):
        exported.generate(x, mask, **{"max_new_tokens": 4, **options})


@pytest.mark.parametrize("kind,task,message", [
    ("whisper", TEXT2TEXT, "its encoder takes input_features .speech.; export it with "
                           "task='automatic-speech-recognition'"),
    ("t5", SPEECH, r"its encoder takes input_ids \(text\); export it with task='text2text-generation'"),
    ("llama", TEXT2TEXT, "decoder without an encoder"),
])
def test_a_model_that_cannot_run_the_task_says_why(kind, task, message):
    with pytest.raises(hfexport.InvalidInputError, match=message):
        hfexport.export(tiny_model(kind, layers=1), backend="dynamo", task=task)


def test_bounds_the_model_cannot_take_are_refused_at_export():
    with pytest.raises(ValueError, match="max_cache_len=40 exceeds the model's 32 positions"):
        hfexport.export(tiny_model("whisper", layers=1), backend="dynamo", task=SPEECH, max_cache_len=40)
    with pytest.raises(hfexport.InvalidInputError, match=r"takes inputs=\{'input_features'"):
        hfexport.export(tiny_model("whisper", layers=1), {"input_ids": torch.ones(1, 3, dtype=torch.long)},
                        backend="dynamo", task=SPEECH)
