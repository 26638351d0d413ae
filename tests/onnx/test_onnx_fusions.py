"""ONNX Runtime fusions (``OnnxConfig(ort_fusions="cpu")``, the default): the fused ops are in the saved file, its
outputs are eager's within the ONNX tolerance, ``ort_fusions=None`` writes none, bad values are refused, and a
fusion that cannot be used falls back to the unfused model with a warning, never to a wrong result."""

from __future__ import annotations

import collections
import warnings

import pytest
import torch

import hfexport
from helpers import tiny_model
from hfexport import ExportError
from hfexport_dynamo.inputs import dummy_inputs

ATOL = 1e-4
MS = "com.microsoft"


def _op_counts(path) -> collections.Counter:
    """``(domain, op type)`` of every node of the ONNX file (main graph and functions), weights not loaded."""
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    nodes = [*model.graph.node, *(n for f in model.functions for n in f.node)]
    return collections.Counter((n.domain or "", n.op_type) for n in nodes)


@pytest.fixture(scope="module")
def bert_fused():
    model = tiny_model("bert")
    return model, hfexport.export(model, backend="onnx", dynamic=True)


def test_bert_file_holds_onnxruntime_fused_ops_and_matches_eager(bert_fused, tmp_path):
    model, exported = bert_fused
    saved = exported.save_pretrained(tmp_path / "bert")
    ops = _op_counts(saved / "model.onnx")
    assert ops[(MS, "MultiHeadAttention")] == 2 and ops[(MS, "BiasGelu")] == 2, ops  # one each per layer
    assert ops[("", "Erf")] == 0 and ops[("", "Softmax")] == 0, ops
    # The skip norms onnxscript fuses run slower on ONNX Runtime's CPU kernel: written back as Add + LayerNormalization
    assert ops[(MS, "SkipLayerNormalization")] == 0 and ops[("", "LayerNormalization")] == 5, ops
    fusions = exported.manifest["onnx"]["fusions"]
    assert fusions["applied"] is True and fusions["target"] == "cpu" and fusions["not_fused_because"] is None
    assert fusions["fired"]["bias_gelu"] == 2 and fusions["fired"]["skip_layer_normalization"] == 4, fusions
    assert fusions["undone"] == {"SkipLayerNormalization": 4}
    assert fusions["ops"] == {f"{MS}.BiasGelu": 2, f"{MS}.MultiHeadAttention": 2}
    assert fusions["nodes_after"] == exported.manifest["onnx"]["node_count"] == sum(ops.values())
    assert fusions["nodes_after"] < fusions["nodes_before"]
    assert fusions["session_disabled_optimizers"] == ["SkipLayerNormFusion"]
    assert "onnx.onnxscript ort_fusions" in exported.manifest["timings_s"]
    assert exported.manifest["verification"]["passed"] is True  # the export's check ran the fused file
    # Another batch and length than traced, padding included, before and after a save and load.
    inputs = dummy_inputs(model, batch=3, seq=11, seed=1)
    inputs["attention_mask"][1, 7:] = 0
    assert exported.verify(inputs, atol=ATOL, rtol=0).passed
    reloaded = hfexport.load(saved)
    assert reloaded.runner.io["fusions"]["session_disabled_optimizers"] == ["SkipLayerNormFusion"]
    report = reloaded.verify(inputs, atol=ATOL, rtol=0, reference=model)
    assert report.passed, report


def test_the_runner_keeps_onnxruntime_from_fusing_the_skip_norms_again(bert_fused, tmp_path):
    import onnxruntime

    from hfexport_onnx.exporter_onnx import OnnxRunner

    _, exported = bert_fused
    kept = tmp_path / "session.onnx"
    options = onnxruntime.SessionOptions()
    options.optimized_model_filepath = str(kept)  # the graph ONNX Runtime runs, after its own fusions
    options.log_severity_level = 3
    OnnxRunner(exported.runner.path, ["CPUExecutionProvider"], exported.manifest["onnx"], options)
    assert _op_counts(kept)[(MS, "SkipLayerNormalization")] == 0
    OnnxRunner(exported.runner.path, ["CPUExecutionProvider"], {}, options)  # no report: ORT's defaults
    assert _op_counts(kept)[(MS, "SkipLayerNormalization")] == 4


def test_fused_bert_zeroes_a_fully_masked_sequence_like_eager(bert_fused):
    model, exported = bert_fused
    inputs = dummy_inputs(model, batch=2, seq=6, seed=2)
    inputs["attention_mask"][1] = 0  # every key hidden: eager's attention gives 0 for these rows, not NaN or a mean
    report = exported.verify(inputs, atol=ATOL, rtol=0)
    assert report.passed, report


def test_ort_fusions_none_writes_plain_onnx(tmp_path):
    model = tiny_model("bert", layers=1)
    exported = hfexport.export(model, backend="onnx", ort_fusions=None)
    ops = _op_counts(exported.runner.path)
    assert not [op for op in ops if op[0] == MS] and ops[("", "Erf")] == 1, ops
    fusions = exported.manifest["onnx"]["fusions"]
    assert fusions["applied"] is False and fusions["not_fused_because"] == "OnnxConfig(ort_fusions=None)"
    assert fusions["nodes_before"] == fusions["nodes_after"] == exported.manifest["onnx"]["node_count"]
    assert fusions["session_disabled_optimizers"] == [] and fusions["fired"] == {}
    assert hfexport.export(model, backend="onnx", ort_fusions=False).manifest["onnx"]["fusions"]["target"] is None
    # No optimizer, no fusions (they run onnxscript's optimizer): said so.
    plain = hfexport.export(model, backend="onnx", optimize=False)
    assert plain.manifest["onnx"]["fusions"]["not_fused_because"] == "not optimized (OnnxConfig(optimize=False))"


@pytest.mark.parametrize("value", ["cuda", "CPU", True, 1, ("cpu",)])
def test_bad_ort_fusions_values_are_refused(value):
    from hfexport_onnx.exporter_onnx import OnnxConfig

    with pytest.raises(ValueError, match=r"ort_fusions must name the ONNX Runtime execution provider to fuse for, "
                                         r"one of 'cpu', or be None \(or False\) for no fusions; got"):
        OnnxConfig(ort_fusions=value)
    assert OnnxConfig().ort_fusions == "cpu" and OnnxConfig(ort_fusions=False).ort_fusions is None


def test_a_listed_class_is_exported_unfused_with_a_warning_naming_the_issue(monkeypatch):
    import hfexport_onnx.exporter_onnx as E

    reason = "microsoft/onnxscript#0000: a made-up fusion bug (test)"
    monkeypatch.setitem(E.ORT_FUSIONS_DISABLE, "BertModel", reason)
    model = tiny_model("bert", layers=1)
    with pytest.warns(E.OrtFusionFallbackWarning, match=r"not applied to BertModel: ORT_FUSIONS_DISABLE\['BertModel'\]: "
                                                        r"microsoft/onnxscript#0000"):
        exported = hfexport.export(model, backend="onnx")
    fusions = exported.manifest["onnx"]["fusions"]
    assert fusions["applied"] is False and "microsoft/onnxscript#0000" in fusions["not_fused_because"]
    assert any("microsoft/onnxscript#0000" in note for note in exported.manifest["notes"])
    assert not [op for op in _op_counts(exported.runner.path) if op[0] == MS]
    # What the sweep does to re-check the entry: the fusions on for the listed class, a failure an error.
    assert E.OnnxExporter.known_failures()["ORT_FUSIONS_DISABLE"] == {"BertModel": reason}
    options = E.OnnxExporter.recheck_options("ORT_FUSIONS_DISABLE", "BertModel")
    assert options == {"optimize": True, "optimize_fallback": False, "ort_fusions": "cpu"}
    with warnings.catch_warnings():
        warnings.simplefilter("error", E.OrtFusionFallbackWarning)
        rechecked = hfexport.export(model, backend="onnx", **options)
    assert rechecked.manifest["onnx"]["fusions"]["applied"] is True


def test_a_fusion_that_raises_falls_back_to_the_unfused_model(monkeypatch):
    import hfexport_onnx._fusions as F

    def broken(model, target="cpu", *, debug=False):
        next(iter(model.graph)).op_type = "HalfRewritten"  # in place, as a real failure may leave it
        raise RuntimeError("rule exploded (test)")

    monkeypatch.setattr(F, "fuse_for_ort", broken)
    conversions = []
    real_export = torch.onnx.export
    monkeypatch.setattr(torch.onnx, "export", lambda *a, **k: conversions.append(1) or real_export(*a, **k))
    model = tiny_model("bert", layers=1)
    with pytest.warns(F.OrtFusionFallbackWarning, match=r"a fusion failed \(RuntimeError: rule exploded \(test\)\)"):
        exported = hfexport.export(model, backend="onnx")
    assert len(conversions) == 1  # the fall back optimizes a copy of the converted graph, not a second conversion
    assert exported.manifest["onnx"]["fusions"]["applied"] is False
    assert exported.manifest["onnx"]["optimized"] is True  # the re-export is optimized, only not fused
    assert not [op for op in _op_counts(exported.runner.path) if op[1] == "HalfRewritten" or op[0] == MS]
    assert exported.manifest["verification"]["passed"] is True
    with pytest.raises(ExportError, match=r"step onnxscript ort_fusions failed for .*rule exploded") as info:
        hfexport.export(model, backend="onnx", optimize_fallback=False)
    assert info.value.step == "onnxscript ort_fusions"


def test_a_fused_graph_onnxruntime_refuses_falls_back_to_the_unfused_model(monkeypatch):
    import hfexport_onnx._fusions as F

    real = F.fuse_for_ort

    def refused(model, target="cpu", *, debug=False):
        report = real(model, target, debug=debug)
        for node in model.graph:
            if node.domain == MS:
                node.op_type = "NotAnOrtOp"  # a contrib op ONNX Runtime has no kernel for
        return report

    monkeypatch.setattr(F, "fuse_for_ort", refused)
    model = tiny_model("bert", layers=1)
    with pytest.warns(F.OrtFusionFallbackWarning, match=r"ONNX Runtime refused the fused model \(.*NotAnOrtOp"):
        exported = hfexport.export(model, backend="onnx")
    assert exported.manifest["onnx"]["fusions"]["applied"] is False
    assert not [op for op in _op_counts(exported.runner.path) if op[0] == MS]
    assert exported.manifest["verification"]["passed"] is True


@pytest.fixture(scope="module")
def llama_decoder():
    """A tiny Llama's one ``decoder`` program (prefill and decode), max_batch=2 for a padded batch of 2; heads of 16
    (GroupQueryAttention's CPU kernel applies RoPE to heads of a multiple of 16 only), 2 query heads per KV head."""
    model = tiny_model("llama", hidden_size=64, num_attention_heads=4, num_key_value_heads=2)
    return model, hfexport.export(model, backend="onnx", task="text-generation", max_batch=2)


def test_llama_decoder_norms_are_fused_and_it_generates_eagers_ids(llama_decoder):
    model, exported = llama_decoder
    assert list(exported.manifest["components"]) == ["decoder"]
    ops = _op_counts(exported.components["decoder"].runner.path)
    assert ops[("", "SimplifiedLayerNormalization")] == 5, ops  # 2 layers x 2 + the final norm
    assert ops[("", "ReduceMean")] == 0 and ops[("", "Pow")] == 0, ops
    fusions = exported.manifest["components"]["decoder"]["onnx"]["fusions"]
    assert fusions["applied"] and fusions["fired"]["rms_normalization"] == 5, fusions
    assert fusions["undone"] == {"SkipSimplifiedLayerNormalization": 4}, fusions
    ids = torch.randint(3, 100, (2, 7), generator=torch.Generator().manual_seed(2))
    mask = torch.ones(2, 7, dtype=torch.long)
    ids[1, :3], mask[1, :3] = 0, 0  # a left-padded row: its padding rows see no key
    for prompt, prompt_mask in ((ids[:1], None), (ids, mask)):
        got = exported.generate(prompt, prompt_mask, max_new_tokens=12)
        with torch.no_grad():
            expected = model.generate(input_ids=prompt, attention_mask=prompt_mask, do_sample=False, max_new_tokens=12)
        assert torch.equal(got, expected), (got, expected)


def test_llama_decoder_attention_reads_each_key_value_head_once(llama_decoder):
    """Each layer's cache write and grouped-query attention are one ONNX Runtime ``GroupQueryAttention``
    (``hfexport_dynamo.cache_attention``, lowered by ``hfexport_onnx._attention``): it reads each key/value head of the
    fixed-capacity cache once, so no node copies a cache-sized tensor per query head (``repeat_kv``'s Expand), and no
    attention MatMul is left beside it."""
    import onnx_ir as ir

    _, exported = llama_decoder
    model = ir.load(exported.components["decoder"].runner.path)
    capacity = exported.manifest["generation"]["max_cache_len"]
    copies = [n.name for n in model.graph if n.op_type == "Expand" and n.outputs[0].dtype == ir.DataType.FLOAT
              and n.outputs[0].shape is not None and capacity in list(n.outputs[0].shape)]
    assert copies == []
    ops = _op_counts(exported.components["decoder"].runner.path)
    assert ops[(MS, "GroupQueryAttention")] == 2, ops  # one per layer
    assert ops[(MS, "FusedMatMul")] == 0 and ops[("", "Softmax")] == 0, ops
    assert exported.manifest["generation"]["cache"]["fused_attention"] is True
    # the attention's output, [batch, seq, heads * dim] as its rotated query's, feeds o_proj with no Reshape between
    # (drop_identity_reshapes: ONNX Runtime runs each Reshape, one per layer per decode step)
    reshaped = [n.name for n in model.graph if n.op_type == "Reshape"
                and n.inputs[0].producer() is not None and n.inputs[0].producer().op_type == "GroupQueryAttention"]
    assert reshaped == []
    assert exported.manifest["components"]["decoder"]["onnx"]["fusions"]["fired"]["identity_reshapes"] >= 2


def test_llama_decoder_rotates_with_one_node_per_tensor_and_packs_its_projections(llama_decoder):
    """RoPE is one ONNX Runtime ``RotaryEmbedding`` for the query and one for the new keys (from the model's tables
    at each token's position id), not the dozen nodes of transformers' ``rotate_half``; the q/k/v and the gate/up
    projections are one MatMul each (:func:`pack_shared_input_matmuls`). The export's own verification at a second
    shape already runs positions that restart within a row (``[0, 1, ..., 5, 0]``), which GroupQueryAttention's own
    rotary (``do_rotary``) gets wrong; the attention's rotary inputs stay empty."""
    import onnx

    model, exported = llama_decoder
    graph = onnx.load(str(exported.components["decoder"].runner.path), load_external_data=False).graph
    for node in (n for n in graph.node if n.op_type == "GroupQueryAttention"):
        attributes = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        assert attributes.get("do_rotary", 0) == 0 and list(node.input[7:10]) == ["", "", ""], list(node.input)
        assert all(node.input[i] for i in range(3)), list(node.input)  # rotated query and key, value
    ops = _op_counts(exported.components["decoder"].runner.path)
    layers = model.config.num_hidden_layers
    assert ops[(MS, "RotaryEmbedding")] == 2 * layers, ops
    assert ops[("", "MatMul")] == 4 * layers + 1, ops  # qkv, o, gate+up, down per layer; the LM head
    assert ops[("", "Neg")] == 0, ops
    fusions = exported.manifest["components"]["decoder"]["onnx"]["fusions"]["fired"]
    assert fusions["packed_matmuls"] == 3 * layers, fusions
    assert exported.manifest["generation"]["cache"]["fused_rotary"] is True
    verification = exported.manifest["components"]["decoder"]["verification"]
    assert verification["passed"] is True and verification["second_shape"]["passed"] is True, verification


def test_pack_shared_input_matmuls_joins_weights_and_keeps_the_outputs():
    import numpy as np
    import onnx_ir as ir
    import onnxruntime

    from hfexport_onnx._fusions import pack_shared_input_matmuls

    rng = np.random.default_rng(0)
    x = ir.val("x", ir.DataType.FLOAT, ir.Shape([2, 3, 8]))
    weights = [ir.Value(name=f"w{i}", const_value=ir.tensor(rng.standard_normal((8, n)).astype(np.float32)))
               for i, n in enumerate((8, 4, 4))]
    shared = ir.Value(name="shared", const_value=ir.tensor(rng.standard_normal((8, 2)).astype(np.float32)))
    nodes = [ir.node("MatMul", [x, w]) for w in weights]
    outputs = [ir.node("Relu", [n.outputs[0]]) for n in nodes]  # the packed MatMuls' outputs are read inside
    twice = [ir.node("MatMul", [x, shared]), ir.node("Relu", [shared])]  # a weight read twice is not packed
    for i, node in enumerate(outputs + twice):
        node.outputs[0].name = f"y{i}"
    graph = ir.Graph([x], [n.outputs[0] for n in outputs + twice], nodes=nodes + outputs + twice,
                     initializers=[*weights, shared], opset_imports={"": 18})
    model = ir.Model(graph, ir_version=10)

    def run() -> list:
        session = onnxruntime.InferenceSession(ir.to_proto(model).SerializeToString())
        return session.run(None, {"x": np.ones((2, 3, 8), np.float32) * np.arange(8, dtype=np.float32)})

    before = run()
    assert pack_shared_input_matmuls(model) == 2
    assert [n.op_type for n in graph] == ["MatMul", "Split", "Relu", "Relu", "Relu", "MatMul", "Relu"]
    assert "shared" in graph.initializers and not {"w0", "w1", "w2"} & set(graph.initializers)
    for got, expected in zip(run(), before, strict=True):
        np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-6)


def test_undo_skip_norms_writes_the_ops_they_fuse():
    import onnx_ir as ir

    from hfexport_onnx._fusions import undo_skip_norms

    x = ir.val("x", ir.DataType.FLOAT, ir.Shape([2, 4]))
    skip = ir.val("skip", ir.DataType.FLOAT, ir.Shape([2, 4]))
    gamma = ir.Value(name="gamma", const_value=ir.tensor(torch.ones(4)))
    beta = ir.Value(name="beta", const_value=ir.tensor(torch.zeros(4)))
    fused = ir.node("SkipLayerNormalization", [x, skip, gamma, beta], domain=MS, num_outputs=4,
                    attributes={"epsilon": 1e-5})
    after = ir.node("Relu", [fused.outputs[3]])  # the residual sum goes on
    fused.outputs[0].name, after.outputs[0].name = "normed", "residual"
    graph = ir.Graph([x, skip], [fused.outputs[0], after.outputs[0]], nodes=[fused, after],
                     initializers=[gamma, beta], opset_imports={"": 18, MS: 1})
    assert undo_skip_norms(ir.Model(graph, ir_version=10)) == {"SkipLayerNormalization": 1}
    assert [n.op_type for n in graph] == ["Add", "LayerNormalization", "Relu"]
    norm = graph.outputs[0].producer()
    assert norm.op_type == "LayerNormalization" and norm.attributes["epsilon"].value == pytest.approx(1e-5)
    assert graph.outputs[0].name == "normed" and after.inputs[0].producer().op_type == "Add"


def test_cli_no_ort_fusions_exports_plain_onnx_and_other_backends_refuse_it(tmp_path, capsys):
    from hfexport import cli

    tiny_model("bert", layers=1).save_pretrained(tmp_path / "bert")
    assert cli.main(["export", str(tmp_path / "bert"), "--backend", "onnx", "--no-ort-fusions",
                     "--output", str(tmp_path / "plain")]) == 0
    fusions = hfexport.load(tmp_path / "plain").manifest["onnx"]["fusions"]
    assert fusions["applied"] is False and fusions["not_fused_because"] == "OnnxConfig(ort_fusions=None)"
    assert cli.main(["export", str(tmp_path / "bert"), "--backend", "dynamo", "--no-ort-fusions",
                     "--output", str(tmp_path / "dynamo")]) == 2
    assert "backend 'dynamo' does not take the option ort_fusions" in capsys.readouterr().err


def _batch_transposed_matmul(x_shape, y_shape):
    """A model of one FusedMatMul(x, y, transBatchA=1), as onnxscript's fused_matmul rules write it."""
    import onnx_ir as ir

    x = ir.Input("x", shape=ir.Shape(x_shape), type=ir.TensorType(ir.DataType.FLOAT))
    y = ir.Input("y", shape=ir.Shape(y_shape), type=ir.TensorType(ir.DataType.FLOAT))
    node = ir.node("FusedMatMul", [x, y], attributes={"transBatchA": 1, "alpha": 0.5}, domain="com.microsoft")
    node.outputs[0].name = "out"
    graph = ir.Graph([x, y], node.outputs, nodes=[node], opset_imports={"": 18, "com.microsoft": 1})
    return ir.Model(graph, ir_version=10)


def test_a_batch_transpose_onnx_runtime_refuses_is_written_as_a_transpose():
    import numpy as np
    import onnx_ir as ir
    import onnxruntime

    from hfexport_onnx._fusions import repair_batch_transposes

    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((4, 2, 3, 5), dtype=np.float32), rng.standard_normal((5, 6), dtype=np.float32)
    expected = 0.5 * np.transpose(x, (1, 2, 0, 3)) @ y  # transBatchA: [d0, d1, d2, d3] -> [d1, d2, d0, d3]

    def run(model):
        session = onnxruntime.InferenceSession(ir.to_proto(model).SerializeToString(),
                                               providers=["CPUExecutionProvider"])
        return session.run(None, {"x": x, "y": y})[0]

    model = _batch_transposed_matmul(x.shape, y.shape)
    with pytest.raises(Exception, match="same rank and rank >= 3"):  # microsoft/onnxscript#2331's rank-4 x rank-2
        run(model)
    assert repair_batch_transposes(model) == 1
    np.testing.assert_allclose(run(model), expected, rtol=1e-5, atol=1e-5)
    assert repair_batch_transposes(_batch_transposed_matmul((4, 2, 3, 5), (4, 2, 5, 6))) == 0  # ORT takes this one


@pytest.mark.slow  # the zoo's tiny SigLIP vision tower, exported once; about 15 s
def test_siglip_vision_tower_fused_for_onnx_runtime_runs_at_another_batch():
    from hfexport_sweep.zoo import build_case

    model, inputs, alt_inputs = build_case("siglip_vision_model/SiglipVisionModel")
    exported = hfexport.export(model, inputs, backend="onnx", dynamic=True)
    assert exported.manifest["onnx"]["fusions"]["undone"].get("FusedMatMul transBatch (as Transpose)", 0) > 0
    report = exported.verify(alt_inputs, atol=1e-4, rtol=1e-3)
    assert report.passed, str(report)


def test_reused_bindings_see_inputs_updated_in_place(llama_decoder):
    """``OnnxRunner.reusing_bindings`` (the decode loop's) binds an unchanged tensor once: a token written into the
    same ``input_ids`` tensor between runs is what the next run reads, as a run with fresh bindings does."""
    from hfexport_dynamo.tasks.causal_lm import new_cache

    _, exported = llama_decoder
    section = exported.manifest["generation"]
    mask = torch.zeros(1, section["max_cache_len"], dtype=torch.long)
    mask[:, :1] = 1
    ids = torch.tensor([[5]])

    def step(cache):
        return exported.run("decoder", input_ids=ids, attention_mask=mask, position_ids=torch.zeros(1, 1, dtype=torch.long),
                            past_length=torch.tensor(0), cache=cache)["logits"].clone()

    fresh = []
    for token in (5, 9):
        ids[0, 0] = token
        fresh.append(step(new_cache(section, 1)))
    cache = new_cache(section, 1)
    with exported.components["decoder"].runner.reusing_bindings():
        reused = []
        for token in (5, 9):
            ids[0, 0] = token  # same tensor, same cache tensors: nothing is bound again
            reused.append(step(cache))
    assert not torch.equal(fresh[0], fresh[1])
    for got, expected in zip(reused, fresh, strict=True):
        torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


def test_rerun_repeats_the_last_bound_run_on_inputs_updated_in_place(llama_decoder):
    """``OnnxRunner.rerun`` (the decode loop's steps after the first): the last run within ``reusing_bindings``
    again, on its bound tensors as they are now; outside that context, or before a run there, it raises."""
    from hfexport_dynamo.tasks.causal_lm import new_cache

    _, exported = llama_decoder
    runner = exported.components["decoder"].runner
    section = exported.manifest["generation"]
    mask = torch.zeros(1, section["max_cache_len"], dtype=torch.long)
    mask[:, :1] = 1
    ids, position, past = torch.tensor([[5]]), torch.zeros(1, 1, dtype=torch.long), torch.tensor(0)

    def step(cache):
        return exported.run("decoder", input_ids=ids, attention_mask=mask, position_ids=position,
                            past_length=past, cache=cache)["logits"].clone()

    ids[0, 0] = 9
    expected = step(new_cache(section, 1))
    with pytest.raises(RuntimeError, match="run once there first"):
        runner.rerun()
    with runner.reusing_bindings():
        with pytest.raises(RuntimeError, match="run once there first"):
            runner.rerun()
        ids[0, 0] = 5
        first = step(new_cache(section, 1))
        ids[0, 0] = 9  # the same tensor: rerun reads the new token
        again = runner.rerun()[0]
    assert not torch.equal(first, expected)
    torch.testing.assert_close(again, expected, atol=1e-5, rtol=1e-5)
    with pytest.raises(RuntimeError, match="run once there first"):
        runner.rerun()


def test_the_optimizers_recoverable_failures_are_quiet_unless_verbose(monkeypatch, caplog):
    """onnxscript's constant folding and onnx_ir's shape inference log a warning for each node or model they leave
    as it was ("Evaluation failed: Axis must be a rank-0 tensor", on Inkling2's image path, dozens of times): inside
    the ONNX export's stage 5 they are dropped, errors still show, and ``--verbose`` shows everything."""
    import logging

    from hfexport_onnx._errors import quiet_onnx_passes

    folding = logging.getLogger("onnxscript.optimizer._constant_folding")
    shapes = logging.getLogger("onnx_ir.passes.common.shape_inference")
    monkeypatch.delenv("HFEXPORT_VERBOSE", raising=False)
    with caplog.at_level(logging.WARNING):
        with quiet_onnx_passes():
            folding.warning("Evaluation failed: %s", "Axis must be a rank-0 tensor")
            shapes.warning("Shape inference failed: %s. Model is left unchanged", "x")
            shapes.error("an error")
        folding.warning("after the body")
        monkeypatch.setenv("HFEXPORT_VERBOSE", "1")
        with quiet_onnx_passes():
            folding.warning("verbose")
    assert [r.getMessage() for r in caplog.records] == ["an error", "after the body", "verbose"]
