"""A text-generation artifact in transformers: ``hfexport.load(dir)`` itself is a model that ``pipeline("text-generation",
...)`` takes (a ``TextGenerationArtifact``), and ``as_transformers(hfexport.load(dir))`` one that
``GenerationMixin.generate`` and the pipeline take, the runtime doing the forward and owning the cache. Greedy ids equal hfexport's own loop (and eager's); seeded sampling (top-k, top-p, repetition penalty)
equals eager transformers with the same seed, on onnx (development loop), executorch-xnnpack and openvino (slow)."""

from __future__ import annotations

import pytest
import torch

import hfexport
from helpers import tiny_model, word_tokenizer
from hfexport_dynamo.tasks import as_transformers
from hfexport_dynamo.tasks.transformers_model import ExportedModelForCausalLM

NEW_TOKENS = 24
SAMPLING = {"do_sample": True, "top_k": 20, "top_p": 0.9, "repetition_penalty": 1.2}
BACKENDS = [pytest.param("onnx"), pytest.param("executorch-xnnpack", marks=pytest.mark.slow),
            pytest.param("openvino", marks=pytest.mark.slow)]


@pytest.fixture(scope="module")
def exports(tmp_path_factory):
    cache = {}

    def get(backend: str):
        if backend not in cache:
            model = tiny_model("llama", layers=1)
            directory = tmp_path_factory.mktemp(backend) / "artifact"
            max_batch = 1 if backend == "executorch-xnnpack" else 2
            hfexport.export(model, backend=backend, task="text-generation", max_cache_len=40,
                            max_batch=max_batch).save_pretrained(directory)
            loaded = hfexport.load(directory)
            cache[backend] = model, loaded, as_transformers(loaded)
        return cache[backend]

    return get


def prompt(rows: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.randint(3, 100, (rows, 7), generator=torch.Generator().manual_seed(4))
    mask = torch.ones_like(ids)
    if rows > 1:  # the second row left-padded by 3
        ids[1, :3], mask[1, :3] = 0, 0
    return ids, mask


@pytest.mark.parametrize("backend", BACKENDS)
def test_generate_greedy_equals_hfexports_loop_and_sampling_equals_eager(backend, exports):
    model, loaded, wrapped = exports(backend)
    assert isinstance(wrapped, ExportedModelForCausalLM)
    rows = 1 if backend == "executorch-xnnpack" else 2
    ids, mask = prompt(rows)
    greedy = wrapped.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=NEW_TOKENS)
    assert torch.equal(greedy, loaded.generate(ids, mask, max_new_tokens=NEW_TOKENS))
    for seed in (0, 1):
        torch.manual_seed(seed)
        sampled = wrapped.generate(ids, attention_mask=mask, max_new_tokens=NEW_TOKENS, **SAMPLING)
        torch.manual_seed(seed)
        with torch.no_grad():
            expected = model.generate(ids, attention_mask=mask, max_new_tokens=NEW_TOKENS, **SAMPLING)
        assert torch.equal(sampled, expected), f"seed {seed}: first difference at {(sampled != expected).nonzero()[:1]}"


@pytest.mark.parametrize("backend", BACKENDS)
def test_pipeline_text_generation_samples_as_eager_with_the_same_seed(backend, exports):
    """``pipeline("text-generation", model=hfexport.load(dir), tokenizer=...)``, the loaded artifact as it is, and
    over ``as_transformers``: seeded sampling gives eager transformers' text."""
    from transformers import TextIteratorStreamer, pipeline

    from hfexport_dynamo.tasks.loaded import TextGenerationArtifact

    model, loaded, wrapped = exports(backend)
    assert isinstance(loaded, TextGenerationArtifact) and isinstance(loaded, hfexport.ExportedModel)
    tokenizer = word_tokenizer()
    torch.manual_seed(7)
    expected = pipeline("text-generation", model=model, tokenizer=tokenizer)("w5 w17 w42", max_new_tokens=NEW_TOKENS,
                                                                             **SAMPLING)
    assert len(expected[0]["generated_text"].split()) > 3 + NEW_TOKENS // 2
    for ours in (loaded, wrapped):
        torch.manual_seed(7)
        got = pipeline("text-generation", model=ours, tokenizer=tokenizer)("w5 w17 w42", max_new_tokens=NEW_TOKENS,
                                                                          **SAMPLING)
        assert got == expected, type(ours).__name__
    for ours in (loaded, wrapped):  # transformers' streamers work as they do for eager models
        streamer = TextIteratorStreamer(tokenizer)
        ours.generate(torch.tensor([[5, 17, 42]]), do_sample=False, max_new_tokens=5, streamer=streamer)
        assert len("".join(streamer).split()) >= 5


def test_a_loaded_artifacts_generate_keeps_the_greedy_loop_and_hands_sampling_to_transformers(exports):
    """``hfexport.load(dir).generate``: hfexport's greedy loop for the calls it takes (``generation_stats`` set), the
    same ids through transformers with a ``generation_config``; seeded sampling equals eager's."""
    from transformers import GenerationConfig

    model, loaded, _ = exports("onnx")
    ids, mask = prompt(2)
    loaded.generation_stats = None
    greedy = loaded.generate(ids, mask, max_new_tokens=NEW_TOKENS)
    assert loaded.generation_stats is not None  # the fast path ran
    assert torch.equal(greedy, loaded.generate(ids, mask, generation_config=GenerationConfig(
        do_sample=False, max_new_tokens=NEW_TOKENS)))
    torch.manual_seed(3)
    sampled = loaded.generate(ids, attention_mask=mask, max_new_tokens=NEW_TOKENS, **SAMPLING)
    torch.manual_seed(3)
    with torch.no_grad():
        assert torch.equal(sampled, model.generate(ids, attention_mask=mask, max_new_tokens=NEW_TOKENS, **SAMPLING))


def test_a_step_past_max_cache_len_names_the_bound(exports):
    _, _, wrapped = exports("onnx")
    with pytest.raises(ValueError, match="max_cache_len=40"):
        wrapped.generate(torch.tensor([[5, 17, 42]]), do_sample=False, max_new_tokens=50, eos_token_id=None)


def test_as_transformers_refuses_an_artifact_of_another_task():
    exported = hfexport.export(torch.nn.Linear(3, 2), {"input": torch.ones(1, 3)}, backend="dynamo")
    with pytest.raises(ValueError, match="task='text-generation'"):
        as_transformers(exported)


def test_pipeline_of_an_artifact_that_is_not_a_text_generation_one_says_which_it_takes():
    """``pipeline("text-generation", model=...)`` of an artifact of one forward pass (or one not saved): the error
    names what the pipeline takes (a loaded text-generation artifact, or ``as_transformers``)."""
    from transformers import pipeline

    exported = hfexport.export(tiny_model("llama", layers=1), backend="dynamo")
    with pytest.raises(AttributeError, match=r"one forward pass\) is not a transformers model.*as_transformers"):
        pipeline("text-generation", model=exported, tokenizer=word_tokenizer())
    assert getattr(exported, "config", None) is None  # getattr's default still works
