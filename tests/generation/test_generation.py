"""Decoders exported for ``task="text-generation"``: greedy ``generate`` over the exported ``decoder`` program (one
program for prefill and decode, over a KV cache of fixed capacity) returns exactly eager
``model.generate(do_sample=False)``'s token ids, on every backend, after ``save_pretrained`` and ``hfexport.load`` in
a new process; the weights are stored once and the cache is written in place; bad input is refused before any
program runs."""

from __future__ import annotations

import json

import pytest
import torch

import hfexport
from helpers import generate_in_fresh_process, selected_params, tiny_model

NEW_TOKENS = 20
MAX_CACHE_LEN = 40  # the longest prompt (9) and its 20 new tokens fit
KINDS = ["llama", "qwen2", "gpt2", "mistral", "phi"]
# (backend, kind) pairs of the development loop; the rest run with -m slow.
QUICK = {("dynamo", kind) for kind in KINDS} | {("onnx", "llama")}
CASES = [pytest.param(backend, kind, marks=() if (backend, kind) in QUICK else pytest.mark.slow,
                      id=f"{backend}-{kind}")
         for backend in ("dynamo", "onnx", "executorch-xnnpack") for kind in KINDS]


def prompts() -> list[tuple[torch.Tensor, torch.Tensor | None]]:
    """Two prompt lengths at batch 1, and a batch of two whose second row is left-padded by 3."""
    def ids(batch: int, length: int, seed: int) -> torch.Tensor:
        return torch.randint(3, 100, (batch, length), generator=torch.Generator().manual_seed(seed))

    padded, mask = ids(2, 7, 2), torch.ones(2, 7, dtype=torch.long)
    padded[1, :3], mask[1, :3] = 0, 0
    return [(ids(1, 5, 0), None), (ids(1, 9, 1), None), (padded, mask)]


def eager_generate(model: torch.nn.Module, ids: torch.Tensor, mask: torch.Tensor | None, **options) -> torch.Tensor:
    with torch.no_grad():
        return model.generate(input_ids=ids, attention_mask=mask, do_sample=False,
                              **{"max_new_tokens": NEW_TOKENS, **options})


def export_and_save(backend: str, kind: str, directory) -> tuple[torch.nn.Module, hfexport.ExportedModel]:
    model = tiny_model(kind)
    exported = hfexport.export(model, backend=backend, task="text-generation", max_cache_len=MAX_CACHE_LEN,
                               max_batch=2)
    exported.save_pretrained(directory)
    return model, exported


@pytest.fixture(scope="module")
def new_process_exports(request, tmp_path_factory):
    """The cases of the new-process test this run selected (the development loop's six; all fifteen in the full
    suite), exported and saved: (backend, kind) -> (model, export), or the error of a failed export, kept for its
    test to raise. The in-process tests below reuse the dynamo Llama."""
    workdir = tmp_path_factory.mktemp("generation-new-process")
    cases = selected_params(request, "test_generate_equals_eager_in_a_new_process", "backend", "kind")
    exports = {}
    for backend, kind in sorted(cases, key=lambda case: (case[0] != "onnx", case)):
        # ONNX first: its load is the process's first (hfexport_dynamo and transformers not imported yet); the
        # ExecuTorch runtime's own new-process generation is checked by test_executorch_keeps_the_cache_in_buffers
        try:
            exports[backend, kind] = export_and_save(backend, kind, workdir / f"{backend}-{kind}")
        except Exception as error:  # noqa: BLE001 - re-raised by the case's test
            exports[backend, kind] = error
    return workdir, exports


@pytest.fixture(scope="module")
def new_process_runs(new_process_exports):
    """Those cases generated in one new process: starting one and loading hfexport, transformers and a backend
    costs about 8 s, once instead of once per case."""
    workdir, exports = new_process_exports
    models = {case: value if isinstance(value, Exception) else value[0] for case, value in exports.items()}
    runs = {f"{backend}-{kind}": (workdir / f"{backend}-{kind}", prompts(), {"max_new_tokens": NEW_TOKENS})
            for (backend, kind), value in exports.items() if not isinstance(value, Exception)}
    return models, generate_in_fresh_process(runs, workdir) if runs else {}


@pytest.mark.parametrize("backend,kind", CASES)
def test_generate_equals_eager_in_a_new_process(backend, kind, new_process_runs):
    cases = prompts()
    models, results = new_process_runs
    model = models[backend, kind]
    if isinstance(model, Exception):
        raise model
    got = results[f"{backend}-{kind}"]
    for (ids, mask), ids_out in zip(cases, got, strict=True):
        expected = eager_generate(model, ids, mask)
        assert ids_out.shape == expected.shape, (ids.shape, ids_out.shape, expected.shape)
        first = (ids_out != expected).nonzero()
        assert torch.equal(ids_out, expected), f"prompt {list(ids.shape)}: first difference at {first[:1].tolist()}"


def new_process_export(new_process_exports, backend: str, kind: str,
                       tmp_path_factory) -> tuple[torch.nn.Module, hfexport.ExportedModel]:
    """The new-process test's export of a case (max_cache_len=40, max_batch=2) where this run made it, else the
    same export made here: the tests that take it only read it and run or generate with it."""
    exported = new_process_exports[1].get((backend, kind))
    if exported is None:
        return export_and_save(backend, kind, tmp_path_factory.mktemp(f"{backend}-{kind}") / "artifact")
    if isinstance(exported, Exception):
        raise exported
    return exported


@pytest.fixture(scope="module")
def llama_generation(new_process_exports, tmp_path_factory):
    return new_process_export(new_process_exports, "dynamo", "llama", tmp_path_factory)


@pytest.fixture(scope="module")
def onnx_llama(new_process_exports, tmp_path_factory):
    return new_process_export(new_process_exports, "onnx", "llama", tmp_path_factory)


def test_a_row_that_reaches_eos_is_padded_as_eager_pads_it(llama_generation):
    model, exported = llama_generation
    ids, mask = prompts()[2]
    free = eager_generate(model, ids, mask, eos_token_id=None)
    eos = int(free[1, ids.shape[1] + 4])  # the second row's 5th new token ends that row
    expected = eager_generate(model, ids, mask, eos_token_id=eos, pad_token_id=0)
    got = exported.generate(ids, mask, max_new_tokens=NEW_TOKENS, eos_token_id=eos, pad_token_id=0)
    assert torch.equal(got, expected)
    assert (got[1, ids.shape[1] + 5:] == 0).all() or got.shape[1] < free.shape[1]  # padded (or all stopped)


def test_generation_options_go_through_transformers_logits_processors(llama_generation):
    model, exported = llama_generation
    ids, _ = prompts()[1]
    options = {"repetition_penalty": 1.5, "min_new_tokens": 4, "no_repeat_ngram_size": 2}
    expected = eager_generate(model, ids, None, eos_token_id=None, **options)
    assert torch.equal(exported.generate(ids, max_new_tokens=NEW_TOKENS, eos_token_id=None, **options), expected)


def test_the_repetition_penalty_skips_left_padding_as_model_generate_does(llama_generation):
    """transformers' generate gives ``RepetitionPenaltyLogitsProcessor`` each row's padding length: a token that is
    only in the padding is not penalized. The padding here is the token eager picks first in that row."""
    model, exported = llama_generation
    ids, mask = prompts()[2]
    first = int(eager_generate(model, ids, mask, repetition_penalty=1.5, eos_token_id=None)[1, ids.shape[1]])
    assert first not in ids[1, 3:].tolist()
    ids[1, :3] = first  # the padding: penalized, the row's first new token would be another
    expected = eager_generate(model, ids, mask, repetition_penalty=1.5, eos_token_id=None)
    assert int(expected[1, ids.shape[1]]) == first
    got = exported.generate(ids, mask, max_new_tokens=NEW_TOKENS, eos_token_id=None, repetition_penalty=1.5)
    assert torch.equal(got, expected)


def test_the_manifest_records_the_task_components_and_bounds(llama_generation, tmp_path):
    _, exported = llama_generation
    exported.save_pretrained(tmp_path / "a")
    manifest = json.loads((tmp_path / "a" / "export.json").read_text())
    assert manifest["task"] == "text-generation"
    assert list(manifest["components"]) == ["decoder"]
    assert manifest["components"]["decoder"]["program_file"] == "decoder/model.pt2"
    assert {"decoder/model.pt2", "config.json"} <= set(manifest["files"])
    generation = manifest["generation"]
    assert (generation["max_cache_len"], generation["max_batch"], generation["cache_layers"]) == (40, 2, 2)
    assert generation["prefill_chunk"] == 40  # min(256, max_cache_len)
    assert generation["cache"] == {"layout": "[batch, kv_heads, max_cache_len, head_dim]", "in_program_buffers": False,
                                   "static_batch": False, "dtype": "float32", "fused_attention": False,
                                   "fused_rotary": False, "ignores_padding": False, "row_shapes": [[[2, 40, 8], [2, 40, 8]]] * 2}
    inputs = {i["name"]: i for i in manifest["components"]["decoder"]["inputs"]}
    assert list(inputs) == ["input_ids", "attention_mask", "position_ids", "past_length", "cache"]
    assert inputs["input_ids"]["dynamic_dims"]["1"]["max"] == 40
    assert inputs["attention_mask"]["shape"][1] == 40  # the whole cache, static


def test_a_prompt_longer_than_prefill_chunk_is_prefilled_in_chunks():
    model = tiny_model("llama")
    exported = hfexport.export(model, backend="dynamo", task="text-generation", max_batch=2, prefill_chunk=4)
    inputs = {i["name"]: i for i in exported.manifest["components"]["decoder"]["inputs"]}
    assert inputs["input_ids"]["dynamic_dims"]["1"]["max"] == 4
    for ids, mask in prompts():  # 5, 9 and 7 tokens: two or three chunks
        assert torch.equal(exported.generate(ids, mask, max_new_tokens=NEW_TOKENS), eager_generate(model, ids, mask))


@pytest.mark.parametrize("overrides,expected", [
    ({"max_position_embeddings": 64}, 64),  # the model's positions
    ({"max_position_embeddings": 32768}, 4096),  # capped
    ({"max_position_embeddings": 32768, "sliding_window": 1024}, 1024),  # Mistral: at most the window
])
def test_max_cache_len_defaults_to_the_models_positions_capped_at_4096(overrides, expected):
    from hfexport_dynamo.tasks import plan_task

    model = tiny_model("mistral" if "sliding_window" in overrides else "llama", layers=1, **overrides)
    plan = plan_task(model, "text-generation")
    assert plan.manifest["generation"]["max_cache_len"] == expected
    assert plan.components[0].inputs["attention_mask"].shape[1] == expected


def test_the_weights_are_stored_once(tmp_path):
    """One program for prefill and decode: the artifact holds each weight once (it held two full copies)."""
    model = tiny_model("llama", hidden_size=64, intermediate_size=128, vocab_size=16000)  # the graph is ~0.6 MB
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    exported = hfexport.export(model, backend="dynamo", task="text-generation", max_cache_len=64)
    exported.save_pretrained(tmp_path / "a")
    on_disk = sum(f.stat().st_size for f in (tmp_path / "a").rglob("*") if f.is_file())
    assert on_disk <= 1.15 * weights, (on_disk, weights)


# ── bad input ───────────────────────────────────────────────────────────────────────────────────────────
def test_generate_on_a_single_program_export_names_the_task_to_export_with():
    model = tiny_model("llama")
    exported = hfexport.export(model, backend="dynamo")
    with pytest.raises(ValueError, match="task='text-generation'") as refused:
        exported.generate(torch.tensor([[5, 6, 7]]), max_new_tokens=3)
    from hfexport_dynamo.tasks import TASKS

    assert all(f"'{task}'" in str(refused.value) for task in TASKS)  # every generation task the tracer plans


@pytest.mark.parametrize("options,message", [
    ({"max_new_tokens": 40}, r"9 tokens plus max_new_tokens=40 exceeds this export's max_cache_len=40"),
    ({"max_new_tokens": 5, "eos_token_id": 100}, r"eos_token_id=100 is outside the vocabulary \[0, 100\)"),
    ({"max_new_tokens": 5, "do_sample": True}, "generates greedily"),
    ({}, "pass max_new_tokens"),
])
def test_bad_generation_options_are_refused_before_any_program_runs(llama_generation, options, message):
    _, exported = llama_generation
    ids, _ = prompts()[1]
    with pytest.raises(ValueError, match=message):
        exported.generate(ids, **options)


def test_an_empty_prompt_is_refused_before_any_program_runs(llama_generation):
    _, exported = llama_generation
    with pytest.raises(ValueError, match=r"input_ids holds no tokens \(shape \[1, 0\]\): give at least one token"):
        exported.generate(torch.zeros(1, 0, dtype=torch.long), max_new_tokens=2)


def _crafted_generation(manifest, edit):
    import copy

    crafted = copy.deepcopy(manifest)
    edit(crafted["generation"], crafted["components"]["decoder"])
    return crafted


@pytest.mark.parametrize("edit,message", [
    (lambda g, d: g.update(max_cache_len=41), r"max_cache_len=41, beyond the decoder program's declared cache length "
                                              r"of 40"),
    (lambda g, d: g.update(max_batch=3), r"max_batch=3, beyond the decoder program's declared batch bound of 2"),
    (lambda g, d: g["cache"]["row_shapes"][0][0].__setitem__(2, 2**40),
     r"describes [\d,]+ bytes of cache and masks .* over the [\d,]+ bytes generate allocates"),
    (lambda g, d: g["cache"].update(row_shapes=[[[2, 40, 2**17], [2, 40, 2**17]]] * 2),  # 320 MiB: under 512
     r"describes [\d,]+ bytes of cache and masks .* over the [\d,]+ bytes generate allocates"),
    (lambda g, d: g["cache"]["row_shapes"].append([[2, 40, 8], [2, 40, 8]]),
     r"3 cache layers where the decoder program's cache input has 4 leaves"),
    (lambda g, d: g["cache"].update(row_shapes=[[[2, 40, 8]]] * 2), r"cache.row_shapes that are not, per layer"),
    (lambda g, d: g.update(max_batch=True), r"max_batch=True, not a positive integer"),
], ids=["cache-len", "batch", "row-bytes", "row-bytes-320mib", "layers", "row-form", "batch-type"])
def test_generation_sizes_from_the_manifest_are_checked_before_any_allocation(llama_generation, edit, message):
    """A crafted ``generation`` section (sizes the cache, the masks and the batch) is refused against the decoder
    program's own declared bounds and a memory budget before ``generate`` makes any buffer from it."""
    _, exported = llama_generation
    manifest = exported.manifest
    exported.manifest = _crafted_generation(manifest, edit)
    try:
        with pytest.raises(ValueError, match=message):
            exported.generate(torch.ones(1, 4, dtype=torch.long), max_new_tokens=2)
    finally:
        exported.manifest = manifest


def test_a_batch_beyond_max_batch_names_the_bound(llama_generation):
    _, exported = llama_generation
    with pytest.raises(ValueError, match="batch of 3 exceeds this export's max_batch=2"):
        exported.generate(torch.ones(3, 4, dtype=torch.long), max_new_tokens=2)
    with pytest.raises(TypeError, match="integer tensor"):
        exported.generate(torch.ones(1, 4), max_new_tokens=2)


@pytest.mark.parametrize("kind,why", [("bert", "no language-modeling head"), ("t5", "encoder-decoder")])
def test_a_model_that_cannot_run_the_task_says_why(kind, why):
    with pytest.raises(hfexport.InvalidInputError, match=why):
        hfexport.export(tiny_model(kind), backend="dynamo", task="text-generation")


def test_an_unknown_task_lists_the_tasks_and_a_task_option_needs_a_task():
    model = tiny_model("llama")
    with pytest.raises(ValueError, match="unknown task 'text-generaton'; tasks: text-generation"):
        hfexport.export(model, backend="dynamo", task="text-generaton")
    with pytest.raises(TypeError, match="max_cache_len"):
        hfexport.export(model, backend="dynamo", max_cache_len=32)
    with pytest.raises(ValueError, match="max_cache_len=100 exceeds the model's 64 positions"):
        hfexport.export(model, backend="dynamo", task="text-generation", max_cache_len=100)


def test_a_head_that_returns_no_cache_says_how_to_load_it():
    import transformers

    torch.manual_seed(0)
    model = transformers.BertLMHeadModel(transformers.BertConfig(
        hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=37, vocab_size=100)).eval()
    with pytest.raises(hfexport.InvalidInputError, match=r"returned no KV cache.*config.is_decoder=True"):
        hfexport.export(model, backend="dynamo", task="text-generation")


def test_max_batch_1_exports_a_static_batch_that_generates_eagers_ids():
    model = tiny_model("llama")
    exported = hfexport.export(model, backend="dynamo", task="text-generation", max_batch=1, max_cache_len=32)
    ids, mask = prompts()[0]
    assert torch.equal(exported.generate(ids, max_new_tokens=NEW_TOKENS), eager_generate(model, ids, mask))
    with pytest.raises(ValueError, match="batch of 2 exceeds this export's max_batch=1"):
        exported.generate(prompts()[2][0], max_new_tokens=2)


def test_onnx_runtime_writes_the_new_positions_into_the_cache_in_place(onnx_llama):
    """The ``decoder`` program's cache outputs are bound to its cache inputs' memory (IO binding over ScatterND):
    a decode step returns the memory it was given, with only the new position written."""
    from hfexport_dynamo.tasks.causal_lm import new_cache

    model, exported = onnx_llama
    section = exported.manifest["components"]["decoder"]["onnx"]
    assert sorted(section["in_place_outputs"].values()) == sorted(
        n for n in section["input_leaves"] if n and n.startswith("cache."))
    ids = torch.tensor([[5, 6, 7]])
    mask = torch.zeros(1, MAX_CACHE_LEN, dtype=torch.long)
    mask[:, :3] = 1
    cache = new_cache(exported.manifest["generation"], 1)
    out = exported.run("decoder", input_ids=ids, attention_mask=mask, position_ids=torch.arange(3)[None],
                       past_length=torch.tensor(0), cache=cache)
    assert all(a.data_ptr() == b.data_ptr() for a, b in zip(torch.utils._pytree.tree_leaves(out["cache"]),
                                       torch.utils._pytree.tree_leaves(cache), strict=True))
    before = [t.clone() for t in torch.utils._pytree.tree_leaves(cache)]
    mask[:, 3] = 1
    second = exported.run("decoder", input_ids=torch.tensor([[8]]), attention_mask=mask,
                          position_ids=torch.tensor([[3]]), past_length=torch.tensor(3), cache=cache)
    for old, new in zip(before, torch.utils._pytree.tree_leaves(cache), strict=True):
        changed = (old != new).any(-1).any(1)[0]  # per position
        assert changed.nonzero().flatten().tolist() == [3]
    with torch.no_grad():
        eager = model(input_ids=torch.tensor([[5, 6, 7, 8]])).logits[:, -1]
    torch.testing.assert_close(second["logits"], eager, atol=1e-4, rtol=1e-3)


def test_onnx_attention_reads_only_the_filled_positions_of_the_cache():
    """Each layer's cache write and attention are one ONNX Runtime GroupQueryAttention, whose present buffers are
    the past ones (IO binding) and which reads the first ``past_length + seq`` positions only: NaN written into the
    cache past them changes no logit (attention over the whole capacity would turn the logits NaN: 0 x NaN)."""
    import onnx

    from hfexport_dynamo.tasks.causal_lm import new_cache

    model = tiny_model("qwen2")  # grouped query heads
    exported = hfexport.export(model, backend="onnx", task="text-generation", max_cache_len=32)
    assert exported.manifest["generation"]["cache"]["fused_attention"] is True
    section = exported.manifest["components"]["decoder"]["onnx"]
    graph = onnx.load(exported.components["decoder"].runner.path, load_external_data=False).graph
    fused = [n for n in graph.node if n.op_type == "GroupQueryAttention" and n.domain == "com.microsoft"]
    assert len(fused) == model.config.num_hidden_layers
    assert sorted(section["in_place_outputs"]) == sorted(o for n in fused for o in n.output[1:])
    cache = new_cache(exported.manifest["generation"], 1)
    for tensor in torch.utils._pytree.tree_leaves(cache):
        tensor[:, :, 4:] = float("nan")
    mask = torch.zeros(1, 32, dtype=torch.long)
    mask[:, :4] = 1
    out = exported.run("decoder", input_ids=torch.tensor([[5, 6, 7, 8]]), attention_mask=mask,
                       position_ids=torch.arange(4)[None], past_length=torch.tensor(0), cache=cache)
    with torch.no_grad():
        eager = model(input_ids=torch.tensor([[5, 6, 7, 8]])).logits[:, -1]
    torch.testing.assert_close(out["logits"], eager, atol=1e-4, rtol=1e-3)


@pytest.mark.parametrize("why,model_options,export_options", [
    ("the model attends without sdpa", {"attn_implementation": "eager"}, {}),
    ("plain ONNX ops asked for", {}, {"ort_fusions": None}),
])
def test_onnx_writes_and_attends_apart_where_the_fused_kernel_cannot_serve(why, model_options, export_options):
    model = tiny_model("llama", **model_options)
    exported = hfexport.export(model, backend="onnx", task="text-generation", max_cache_len=32, **export_options)
    assert exported.manifest["generation"]["cache"]["fused_attention"] is False, why
    import onnx

    graph = onnx.load(exported.components["decoder"].runner.path, load_external_data=False).graph
    assert not [n.name for n in graph.node if n.op_type == "GroupQueryAttention"]
    assert {n.op_type for n in graph.node if n.domain == "com.microsoft"} <= (
        {"MultiHeadAttention", "SkipSimplifiedLayerNormalization", "SimplifiedLayerNormalization",
         "RotaryEmbedding"} if export_options.get("ort_fusions", "cpu") else set())
    ids, mask = prompts()[1]
    assert torch.equal(exported.generate(ids, max_new_tokens=NEW_TOKENS), eager_generate(model, ids, mask))


@pytest.mark.slow
@pytest.mark.parametrize("max_batch,kernels", [
    (1, {"llama::update_cache", "llama::custom_sdpa"}),  # ExecuTorch's LLM kernels: filled positions only
    (2, {"aten::index_put_"}),  # a padding mask: the masked attention over the whole capacity
])
def test_executorch_keeps_the_cache_in_buffers_written_in_place(max_batch, kernels, tmp_path):
    """On ExecuTorch the cache is the program's mutable buffers: no cache input, and the program writes them in place
    (no functional ``index_put`` followed by a ``copy_`` of the whole buffer back). At ``max_batch=1`` each layer
    writes and attends with ExecuTorch's LLM kernels, which read only the filled positions and take no padding
    mask: ``generate`` runs a left-padded row without its padding, with eager's ids, in a new process."""
    from executorch.exir._serialize._program import deserialize_pte_binary

    model = tiny_model("llama")
    exported = hfexport.export(model, backend="executorch-xnnpack", task="text-generation", max_cache_len=32,
                               max_batch=max_batch)
    cache = exported.manifest["generation"]["cache"]
    assert cache["in_program_buffers"] is True
    assert cache["fused_attention"] is cache["ignores_padding"] is (max_batch == 1)
    inputs = [i["name"] for i in exported.manifest["components"]["decoder"]["inputs"]]
    # with ExecuTorch's LLM kernels, its LLM runner's inputs (tests/executorch/test_llm_runner.py)
    assert inputs == (["input_ids", "input_pos"] if max_batch == 1 else
                      ["input_ids", "attention_mask", "position_ids", "past_length"])
    directory = exported.save_pretrained(tmp_path / "a")
    program = deserialize_pte_binary((directory / "decoder" / "model.pte").read_bytes())
    program = getattr(program, "program", program)
    ops = {op.name for plan in program.execution_plan for op in plan.operators}
    assert kernels <= ops and not {"aten::index_put", "aten::copy_"} & ops, sorted(ops)
    padded = (torch.tensor([[0, 0, 0, 11, 12, 13, 14]]), torch.tensor([[0, 0, 0, 1, 1, 1, 1]]))
    cases = [prompts()[1], padded]
    got = generate_in_fresh_process({"run": (directory, cases, {"max_new_tokens": NEW_TOKENS})}, tmp_path)["run"]
    for (ids, mask), ids_out in zip(cases, got, strict=True):
        assert torch.equal(ids_out, eager_generate(model, ids, mask)), ids.tolist()
    from hfexport import cli

    assert cli.main(["verify", str(directory)]) == 0  # the smoke run at the recorded shapes: positions, past 0


@pytest.mark.parametrize("rope", [{"rope_type": "default"}, {"rope_type": "dynamic", "factor": 2.0}])
def test_onnx_fused_attention_applies_rope_only_where_the_tables_are_the_models(rope, request):
    """RoPE moves into the fused attention (``fused_rotary``) when the model's cos/sin at a position are its table's
    row; a RoPE whose frequencies depend on the length (``dynamic``) stays before it. Either way eager's ids. The
    default RoPE is tiny_model("llama")'s own: its case takes the new-process test's ONNX Llama (max_cache_len=40:
    the 9-token prompt and 30 new tokens fit)."""
    if rope["rope_type"] == "default":
        assert tiny_model("llama").config.rope_parameters == {**rope, "rope_theta": 10000.0}
        model, exported = request.getfixturevalue("onnx_llama")
    else:
        model = tiny_model("llama", rope_parameters={**rope, "rope_theta": 10000.0})
        exported = hfexport.export(model, backend="onnx", task="text-generation", max_cache_len=48)
    cache = exported.manifest["generation"]["cache"]
    assert cache["fused_attention"] is True and cache["fused_rotary"] is (rope["rope_type"] == "default")
    prompt = torch.randint(3, 100, (1, 9), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        expected = model.generate(input_ids=prompt, do_sample=False, max_new_tokens=30)
    assert torch.equal(exported.generate(prompt, max_new_tokens=30), expected)
