"""The onnx backend: real MiniLM and a 13-architecture tiny-config matrix on ONNX Runtime, config validation,
naming, providers, and the failure paths (opset too low, optimizer crash, a session ORT refuses)."""

from __future__ import annotations

import copy
import functools
import inspect
import json
import re
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path

import pytest
import torch

import hfexport
from helpers import tiny_model
from hfexport import ExportError
from hfexport_dynamo.inputs import dummy_inputs

ATOL = 1e-4
WORKAROUNDS = Path(__file__).parents[2] / "packages/hfexport-onnx/src/hfexport_onnx/workarounds"


@functools.cache
def onnx_export(kind: str) -> tuple[torch.nn.Module, hfexport.ExportedModel]:
    """``(model, export)`` of a tiny model with dynamic=True and inputs from its config; cached for the session
    (test_onnx_workarounds.py reuses the Llama and BERT exports for the "with the workaround" half). One layer
    (about two thirds of two layers' export time) except BERT, whose two GELUs the fusion test counts."""
    model = tiny_model(kind, layers=None if kind == "bert" else 1)
    return model, hfexport.export(model, backend="onnx", dynamic=True)


ARCHITECTURES = ["bert", "roberta", "distilbert", "llama", "qwen2", "gpt2", "mistral", "phi", "t5", "bart", "vit",
                 "convnext", "whisper"]


# In the development loop (-m "not slow"): an encoder, a decoder (rope, GQA), an encoder-decoder and a vision model;
# the other nine run with the full suite.
ARCHITECTURES_FAST = ("bert", "llama", "t5", "vit")


@pytest.mark.parametrize("kind", [k if k in ARCHITECTURES_FAST else pytest.param(k, marks=pytest.mark.slow)
                                  for k in ARCHITECTURES])
def test_tiny_architecture_exports_dynamic_and_matches_on_ort_at_two_shapes(kind):
    model, exported = onnx_export(kind)
    assert exported.manifest["onnx"]["optimized"], exported.manifest["onnx"]
    traced = dummy_inputs(model)  # batch 2
    second = dummy_inputs(model, batch=3, seq=13, seed=1)
    for inputs in (traced, second):
        report = exported.verify(inputs, atol=ATOL, rtol=0)
        assert report.passed, report
    main = exported.manifest["inputs"][0]
    assert "0" in main["dynamic_dims"], f"batch of {main['name']} should stay dynamic: {main}"


def _minilm_inputs(tokenizer, sentences: list[str], length: int) -> dict:
    return dict(tokenizer(sentences, padding="max_length", truncation=True, max_length=length, return_tensors="pt"))


def test_real_minilm_batch2_seq8_runs_at_batch3_seq17_with_padding_before_and_after_save(tmp_path):
    from transformers import AutoTokenizer

    from hfexport_dynamo.demo import minilm_demo, minilm_path

    model, _, _ = minilm_demo()
    tokenizer = AutoTokenizer.from_pretrained(minilm_path())
    trace = _minilm_inputs(tokenizer, ["hfexport turns models into artifacts, and back.", "Runs them."], 8)
    check = _minilm_inputs(tokenizer, [
        "A different batch size and sequence length exercise the dynamic dimensions of the program.",
        "Short one.", "Padding in the attention mask must not change the unpadded tokens."], 17)
    assert trace["input_ids"].shape == (2, 8) and check["input_ids"].shape == (3, 17)
    assert (check["attention_mask"] == 0).any(), "the check batch must contain padding"

    exported = hfexport.export(model, trace, backend="onnx", dynamic=True)
    assert exported.manifest["onnx"]["optimized"]
    report = exported.verify(check, atol=ATOL, rtol=0)
    assert report.passed and report.max_abs_diff <= ATOL, report

    saved = exported.save_pretrained(tmp_path / "minilm")
    assert sorted(p.name for p in saved.iterdir()) == ["config.json", "export.json", "model.onnx", "model.onnx.data",
                                                        "verification.safetensors"]
    assert (saved / "model.onnx").stat().st_size < (saved / "model.onnx.data").stat().st_size  # weights outside
    reloaded = hfexport.load(saved)
    report = reloaded.verify(check, atol=ATOL, rtol=0, reference=model)
    assert report.passed and report.max_abs_diff <= ATOL, report
    assert type(reloaded(**check)).__name__ == "BaseModelOutputWithPoolingAndCrossAttentions"

    manifest = json.loads((saved / "export.json").read_text())
    section = manifest["onnx"]
    assert section["opset"] == 18 and section["optimized"] is True and section["not_optimized_because"] is None
    assert section["providers"] == ["CPUExecutionProvider"] and section["node_count"] > 100
    assert section["input_leaves"] == ["input_ids", "token_type_ids", "attention_mask"]
    assert section["output_leaves"] == ["last_hidden_state", "pooler_output"]
    assert {"onnx", "onnxscript", "onnx-ir", "onnxruntime", "hfexport-onnx"} <= set(manifest["versions"])
    import onnx

    proto = onnx.load(str(saved / "model.onnx"), load_external_data=False)
    props = {p.key: p.value for p in proto.metadata_props}
    assert props["pkg.hfexport.model_class"] == "BertModel" and props["pkg.hfexport.backend"] == "onnx"
    assert [i.name for i in proto.graph.input] == section["input_leaves"]
    assert [o.name for o in proto.graph.output] == section["output_leaves"]


def test_cache_input_and_output_flatten_to_readable_graph_names():
    """A decode step with a DynamicCache in and out: pytree leaves map to named ONNX inputs and outputs."""
    model = tiny_model("llama")
    prompt = torch.randint(0, 100, (1, 5), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        cache = model(input_ids=prompt, use_cache=True).cache
    inputs = {"input_ids": torch.tensor([[7]]), "attention_mask": torch.ones(1, 6, dtype=torch.long), "cache": cache}
    exported = hfexport.export(model, copy.deepcopy(inputs), backend="onnx")
    section = exported.manifest["onnx"]
    assert section["input_leaves"][:2] == ["input_ids", "attention_mask"]
    assert section["input_leaves"][2:] == [f"cache.layers.{i}.{kv}" for i in range(2) for kv in ("keys", "values")]
    assert section["output_leaves"][0] == "logits" and len(section["output_leaves"]) == 5
    report = exported.verify(inputs, atol=ATOL, rtol=0)
    assert report.passed, report
    out = exported(**copy.deepcopy(inputs))
    assert type(out.cache).__name__ == "DynamicCache" and out.cache.get_seq_length() == 6


class _Passthrough(torch.nn.Module):
    def forward(self, x, y):
        return x, (x * y, x * y), y


def _patched_targets() -> tuple:
    from torch.onnx._internal.exporter import _core, _fx_passes, _registration

    # stage 1's and stage 2's patches, and what lower enters (_torch_onnx.torch_onnx_pipeline)
    return (torch.Tensor.__rsub__, torch.rsub, _core._handle_output_node, _registration.ONNXRegistry.from_torchlib,
            _fx_passes.decompose_with_registry)


def test_tuple_outputs_get_names_and_an_input_returned_as_is_keeps_its_name():
    x, y = torch.randn(2, 3), torch.randn(2, 3)
    before = _patched_targets()
    exported = hfexport.export(_Passthrough(), {"x": x, "y": y}, backend="onnx")
    assert _patched_targets() == before  # stage 1 and 2 patches and the pipeline's are reverted after the export
    section = exported.manifest["onnx"]
    assert section["input_leaves"] == ["x", "y"]
    assert section["output_leaves"] == ["output_0", "output_1_0", "output_1_1", "output_2"]
    out = exported(x=x, y=y)
    assert torch.equal(out[0], x) and torch.equal(out[2], y) and torch.allclose(out[1][1], x * y)


# ── config ─────────────────────────────────────────────────────────────────────────────────────────────
@pytest.mark.parametrize("options,error,match", [
    ({"opset_version": 5}, ValueError, r"opset_version must be an int from 7 to \d+"),
    ({"opset_version": "18"}, ValueError, "got '18'"),
    ({"optimize": "yes"}, TypeError, "optimize must be True or False"),
    ({"optimize_fallback": 1}, TypeError, "optimize_fallback must be True or False"),
    ({"providers": ("NoSuchExecutionProvider",)}, ValueError, "valid values: .*CPUExecutionProvider"),
    ({"providers": ()}, ValueError, "none given"),
])
def test_config_validation_lists_valid_values(options, error, match):
    from hfexport_onnx import OnnxConfig

    with pytest.raises(error, match=match):
        OnnxConfig(**options)


def test_config_defaults_and_options_through_export():
    from hfexport_onnx import OnnxConfig, OnnxExporter

    config = OnnxConfig(providers="CPUExecutionProvider")
    assert (config.opset_version, config.optimize, config.providers) == (18, True, ("CPUExecutionProvider",))
    assert OnnxExporter.config_class is OnnxConfig and OnnxExporter.name == "onnx"
    with pytest.raises(TypeError, match="does not take 'opset'.*opset_version"):
        hfexport.export(torch.nn.Linear(2, 2), {"input": torch.ones(1, 2)}, backend="onnx", opset=18)


# ── stages and workarounds as data ─────────────────────────────────────────────────────────────────────
def test_stages_are_the_documented_five():
    from hfexport_onnx import OnnxExporter

    assert [(s.number, s.title) for s in OnnxExporter.stages] == [
        (1, "Torch patches"), (2, "ONNX patches"), (3, "FX node fixes"), (4, "ONNX translations"),
        (5, "ONNX IR fixes")]
    assert {"onnx", "onnxscript", "onnx-ir", "onnxruntime", "hfexport-onnx", "torch"} <= set(OnnxExporter.toolchain)


def test_every_workaround_is_greppable_and_documented():
    """Every registered ONNX workaround is a ``_patch_``/``_fix_``/``_aten_`` function of ``workarounds/<kind>.py``,
    the module of its stage, with a short Why / Upstream / Remove when naming its upstream issue (or none found)."""
    import hfexport_onnx.exporter_onnx as E

    stage_module = {"patch": {"onnx": "torch_patches", "onnx.internals": "onnx_patches"},
                    "fx_node_fix": {"onnx": "node_fixes"}, "onnx_translation": {"onnx": "translations"},
                    "onnx_ir_fix": {"onnx": "ir_fixes"}}
    listed = {f"hfexport_onnx.workarounds.{file.stem}.{name}" for file in WORKAROUNDS.glob("*.py")
              for name in re.findall(r"^def ((?:_patch_|_fix_|_aten_)\w+)", file.read_text(), re.M)}
    registered = [r for r in hfexport.list_workarounds() if r.module.startswith("hfexport_onnx.")]
    assert sorted(listed) == sorted(r.qualified_name for r in registered)  # translations and IR fixes included
    assert {r.scope for r in registered} == {"onnx", "onnx.internals"} == set(E.OnnxExporter.scopes) - {"dynamo"}
    for r in registered:
        assert r.module == f"hfexport_onnx.workarounds.{stage_module[r.kind][r.scope]}", (r.name, r.kind, r.module)
        assert r.name.startswith({"onnx_translation": "_aten_", "onnx_ir_fix": "_fix_ir_"}.get(r.kind, "_")), r.name
        doc = r.func.__doc__
        assert doc and doc.strip().splitlines()[0], r.name
        for part in ("**Why**", "**Upstream**", "**Remove when**"):
            assert part in doc, f"{r.name} lacks {part}"
        assert re.search(r"[\w-]+/[\w-]+#\d+|none found", doc), f"{r.name} names no upstream issue"
        assert len(inspect.cleandoc(doc).splitlines()) <= 9, f"{r.name}'s docstring is long"
    assert all(isinstance(v, str) and re.search(r"#\d+", v) for v in E.ONNX_DISABLE_OPTIMIZE.values())


# ── failure paths ──────────────────────────────────────────────────────────────────────────────────────
class _LayerNormMLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.norm, self.linear = torch.nn.LayerNorm(8), torch.nn.Linear(8, 8)

    def forward(self, x):
        return self.linear(torch.nn.functional.gelu(self.norm(x))).relu()


def test_opset_lower_than_the_graph_needs_is_a_clear_error_and_other_opsets_work():
    model, x = _LayerNormMLP().eval(), torch.randn(2, 8)
    before = _patched_targets()
    with pytest.raises(ExportError, match=r"step torch.onnx.export failed.*opset_version=12 is lower than this graph "
                                          r"needs: it uses LayerNormalization \(from opset 17\)") as info:
        hfexport.export(model, {"x": x}, backend="onnx", opset_version=12)
    assert "opset_version=18" in str(info.value)  # the hint
    assert _patched_targets() == before  # reverted after a failed export too
    for opset in (17, 20):  # 17: converted down from torchlib's 18; 20: ONNX Gelu, no _aten_gelu
        exported = hfexport.export(model, {"x": x}, backend="onnx", opset_version=opset)
        assert exported.manifest["onnx"]["opset"] == opset
        assert ("_aten_gelu" in exported.manifest["onnx"]["translations"]) == (opset < 20)
        assert exported.verify({"x": x}, atol=ATOL).passed


def _split_heads_export(**options):
    """c19: a split along a dynamic axis with a symbolic split size (microsoft/onnxscript#2543)."""
    from field_cases.c19_split_dynamic_axis import SplitHeads
    from torch.export import Dim

    torch.manual_seed(0)
    model = SplitHeads().eval()
    seq = Dim("seq", min=2, max=64)
    x = torch.randn(1, 10, 8)
    return model, hfexport.export(model, {"x": x}, backend="onnx", dynamic_shapes={"x": {1: 2 * seq}}, **options)


def test_optimizer_crash_falls_back_to_the_unoptimized_model_with_a_warning():
    from hfexport_onnx.exporter_onnx import OptimizerFallbackWarning

    with pytest.warns(OptimizerFallbackWarning, match=r"optimizer failed on SplitHeads \(PassError ← AttributeError"):
        model, exported = _split_heads_export()
    section = exported.manifest["onnx"]
    assert section["optimized"] is False and section["not_optimized_because"].startswith("optimizer failed: ")
    assert any("unoptimized model was kept" in note for note in exported.manifest["notes"])
    for seq in (5, 7):  # the traced shape and another one along the dynamic axis
        x = torch.randn(1, 2 * seq, 8)
        assert exported.verify({"x": x}, atol=ATOL).passed


def test_onnx_disable_optimize_skips_the_optimizer_and_says_why(monkeypatch):
    import hfexport_onnx.exporter_onnx as E

    monkeypatch.setitem(E.ONNX_DISABLE_OPTIMIZE, "SplitHeads", "microsoft/onnxscript#2543: SplitToSequence folding")
    with warnings.catch_warnings():
        warnings.simplefilter("error", E.OptimizerFallbackWarning)  # the optimizer is not even tried
        _, exported = _split_heads_export()
    assert exported.manifest["onnx"]["not_optimized_because"] == (
        "ONNX_DISABLE_OPTIMIZE['SplitHeads']: microsoft/onnxscript#2543: SplitToSequence folding")
    _, exported = _split_heads_export(optimize=False)
    assert exported.manifest["onnx"]["not_optimized_because"] == "OnnxConfig(optimize=False)"


def test_known_failures_and_recheck_options_run_the_optimizer_for_a_listed_class_and_fail_on_its_crash(monkeypatch):
    """What the sweep does to re-check an ONNX_DISABLE_OPTIMIZE entry, without touching the table."""
    import hfexport_onnx.exporter_onnx as E

    reason = "microsoft/onnxscript#2543: SplitToSequence folding"
    monkeypatch.setitem(E.ONNX_DISABLE_OPTIMIZE, "SplitHeads", reason)
    assert E.OnnxExporter.known_failures() == {"ONNX_DISABLE_OPTIMIZE": {"SplitHeads": reason}, "ORT_FUSIONS_DISABLE": {}}
    options = E.OnnxExporter.recheck_options("ONNX_DISABLE_OPTIMIZE", "SplitHeads")
    assert options == {"optimize": True, "optimize_fallback": False}
    with warnings.catch_warnings():
        warnings.simplefilter("error", E.OptimizerFallbackWarning)  # no fallback: the crash is the error
        with pytest.raises(ExportError, match=r"step onnxscript optimizer failed for SplitHeads: PassError") as info:
            _split_heads_export(**options)
    assert info.value.step == "onnxscript optimizer" and info.value.internal is False
    assert E.ONNX_DISABLE_OPTIMIZE == {"SplitHeads": reason}  # the table is read, never changed
    with pytest.raises(KeyError, match="has no known-failure list 'EXPORT_SKIPS'; it has"):
        E.OnnxExporter.recheck_options("EXPORT_SKIPS", "SplitHeads")


def _fix_ir_break_relu(graph):
    """Test-only IR fix: turn the Relu into an op that does not exist."""
    for node in graph:
        if node.op_type == "Relu":
            node.op_type = "NotAnOnnxOp"
            return 1
    return 0


def test_a_session_ort_refuses_names_the_node_and_op_and_leaves_nothing_behind(monkeypatch, tmp_path):
    import hfexport._registry as registry
    import hfexport_onnx.exporter_onnx as E
    from hfexport.plugin import register_workaround

    monkeypatch.setattr(registry, "_REGISTRY", list(registry._REGISTRY))  # the test-only fix goes with the test
    register_workaround("onnx_ir_fix", "onnx")(_fix_ir_break_relu)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # where the runner's directory would go
    with pytest.raises(ExportError, match=r"step onnxruntime.InferenceSession failed.*OnnxSessionError: ONNX Runtime "
                                          r"\(CPUExecutionProvider\) cannot create a session for model.onnx: "
                                          r"node 'node_relu' \(op NotAnOnnxOp") as info:
        hfexport.export(_LayerNormMLP(), {"x": torch.randn(2, 8)}, backend="onnx")
    assert isinstance(info.value.__cause__, E.OnnxSessionError)
    # the runner's directory (hfexport-onnxrunner-*) is gone; torch may create its own cache dir there (when this
    # test is the first of a process to start torch._inductor: torchinductor_<user>), which is not ours
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith("hfexport")] == []


# ── the runner ─────────────────────────────────────────────────────────────────────────────────────────
def test_load_falls_back_to_cpu_when_the_exported_providers_are_missing(tmp_path):
    model, x = _LayerNormMLP().eval(), torch.randn(2, 8)
    saved = hfexport.export(model, {"x": x}, backend="onnx").save_pretrained(tmp_path / "ln")
    manifest = json.loads((saved / "export.json").read_text())
    for section in (manifest, manifest["components"]["model"]):  # the top level repeats the default component's
        section["onnx"]["providers"] = ["NoSuchExecutionProvider"]
    (saved / "export.json").write_text(json.dumps(manifest))
    with pytest.warns(UserWarning, match="running on CPUExecutionProvider"):
        reloaded = hfexport.load(saved)
    assert reloaded.runner.providers == ["CPUExecutionProvider"]
    assert reloaded.verify({"x": x}, atol=ATOL, reference=model).passed


def test_saving_an_export_links_its_files_and_a_loaded_artifact_copies_them(tmp_path):
    """An export's runner file lives in the runner's own temporary directory, which nothing writes again: saving
    hard-links it where the file system allows (a 2 GB ``model.onnx.data`` is not copied); a loaded artifact's
    files are the user's, and saving it elsewhere copies them. Both artifacts load and verify."""
    model, x = _LayerNormMLP().eval(), torch.randn(2, 8)
    exported = hfexport.export(model, {"x": x}, backend="onnx")
    saved = exported.save_pretrained(tmp_path / "ln")
    source = exported.runner.path
    same_device = source.stat().st_dev == saved.stat().st_dev
    assert ((saved / "model.onnx").stat().st_ino == source.stat().st_ino) is same_device
    resaved = hfexport.load(saved).save_pretrained(tmp_path / "again")
    assert (resaved / "model.onnx").stat().st_ino != (saved / "model.onnx").stat().st_ino
    for artifact in (saved, resaved):
        assert hfexport.load(artifact).verify({"x": x}, atol=ATOL, reference=model).passed


def test_runner_takes_explicit_providers_and_session_options(tmp_path):
    import onnxruntime

    from hfexport_onnx import OnnxRunner

    model, x = _LayerNormMLP().eval(), torch.randn(2, 8)
    exported = hfexport.export(model, {"x": x}, backend="onnx")
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = 1
    runner = OnnxRunner(exported.runner.path, ["CPUExecutionProvider"], exported.manifest["onnx"], options)
    with torch.no_grad():
        assert torch.allclose(runner.run((x,))[0], model(x), atol=ATOL)
    with pytest.raises(TypeError, match="expected 1 input tensors"):
        runner.run((x, x))


def test_importing_the_package_does_not_import_the_toolchain():
    code = ("import sys, hfexport_onnx; print([m for m in ('onnx', 'onnxscript', 'onnxruntime', 'torch.onnx') "
            "if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip().splitlines()[-1] == "[]"


@pytest.mark.slow  # the zoo's tiny Mamba through torch.onnx; about 25 s on an idle 2-core machine
def test_a_scan_rewritten_recurrence_exports_to_onnx_with_a_dynamic_sequence():
    """Mamba's selective scan runs as ``higher_order.scan`` (hfexport_dynamo._recurrences); torch.onnx's type
    promotion re-ran it with autograd on and failed ("Expected leaf to be a Tensor or None, got SymInt") until
    the conversion ran under no_grad."""
    from hfexport_sweep.zoo import build_case

    model, inputs, _ = build_case("mamba/MambaModel")
    exported = hfexport.export(model, inputs, backend="onnx", dynamic=True)
    for seq in (5, 13):  # traced at 8
        ids = torch.randint(0, model.config.vocab_size, (3, seq), generator=torch.Generator().manual_seed(seq))
        report = exported.verify({"input_ids": ids, "attention_mask": torch.ones_like(ids)}, atol=ATOL, rtol=1e-3)
        assert report.passed, str(report)


def test_the_saved_model_names_no_file_of_the_exporting_machine(tmp_path):
    """torch.onnx writes each node's Python stack (absolute paths of the checkout and site-packages) into the
    node's metadata: dropped before the file is written; the module hierarchy stays."""
    import sys

    import onnx

    _, exported = onnx_export("llama")
    saved = exported.save_pretrained(tmp_path / "llama")
    raw = (saved / "model.onnx").read_bytes()
    here = str(Path(__file__).resolve().parents[2])
    assert here.encode() not in raw and sys.prefix.encode() not in raw
    graph = onnx.load(str(saved / "model.onnx"), load_external_data=False).graph
    keys = {p.key for node in graph.node for p in node.metadata_props}
    assert "pkg.torch.onnx.stack_trace" not in keys and "namespace" in keys, keys


def test_a_backends_typed_config_names_the_config_it_got():
    """``Exporter.config_as`` / ``ExportContext.config_as``: the backend's config class, or a TypeError naming both."""
    from hfexport.plugin import ExportConfig
    from hfexport_onnx import OnnxConfig, OnnxExporter

    exporter = OnnxExporter(opset_version=18)
    assert exporter.onnx_config is exporter.config and exporter.config_as(ExportConfig).opset_version == 18
    exporter.config = ExportConfig()
    with pytest.raises(TypeError, match="this OnnxExporter's config is an instance of ExportConfig, not of OnnxConfig"):
        exporter.onnx_config  # noqa: B018
    assert isinstance(OnnxExporter().config_as(OnnxConfig), OnnxConfig)
