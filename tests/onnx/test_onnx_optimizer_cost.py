"""What an ONNX export pays outside its graph's own work: onnxscript's multi-output matcher (the workaround
``_patch_multi_output_match_checks_its_anchor_first`` of ``hfexport_onnx/workarounds/onnx_patches.py``, left out
with ``disable=``) and torch.onnx's torchlib registry (built once per process by the pipeline,
``hfexport_onnx/_torch_onnx.py``): the work each saves, and the same graph either way."""

from __future__ import annotations

import onnx
import pytest
import torch

import hfexport

pytest.importorskip("onnxscript")

MATCH_PATCH = "_patch_multi_output_match_checks_its_anchor_first"


class HalvesAndMore(torch.nn.Module):
    """Two ``Slice`` of one input (the first output node of onnxscript's multi-output rule ``SlicesSplit``), among a
    dozen other nodes. torch.onnx writes each ``Slice`` with its ``steps``, which that rule's pattern leaves out, so
    the rule is tried here and never fires (the next test shows it firing, patched)."""

    def __init__(self):
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Linear(8, 8) for _ in range(4))

    def forward(self, x):
        for layer in self.layers:
            x = torch.tanh(layer(x)) + x
        left, right = x[..., :4], x[..., 4:8]  # the rule wants both ends written out
        return left * right + 1.0


def test_multi_output_rules_try_only_the_nodes_their_first_output_matches(monkeypatch):
    from onnxscript.rewriter._matcher import SimplePatternMatcher

    tried: list[str] = []
    original = SimplePatternMatcher._multi_match

    def counting(self, candidate, *args, **kwargs):
        tried.append(candidate[0].op_type)
        return original(self, candidate, *args, **kwargs)

    monkeypatch.setattr(SimplePatternMatcher, "_multi_match", counting)
    torch.manual_seed(0)
    model = HalvesAndMore().eval()
    inputs = {"x": torch.randn(2, 8)}
    expected = model(**inputs)

    exports = {}
    for label, disable in (("patched", ()), ("onnxscript's own", (MATCH_PATCH,))):
        tried.clear()
        exported = hfexport.export(model, inputs, backend="onnx", disable=disable)
        graph = onnx.load(str(exported.runner.path), load_external_data=False).graph
        exports[label] = (list(tried), [node.op_type for node in graph.node], exported(**inputs))

    patched_tried, patched_ops, patched_out = exports["patched"]
    own_tried, own_ops, own_out = exports["onnxscript's own"]
    # Unpatched, every node of every rewrite pass enters the combination loop; patched, only the Slices do.
    assert set(patched_tried) == {"Slice"}, patched_tried
    assert len(own_tried) > 4 * len(patched_tried), (len(own_tried), len(patched_tried))
    assert len(set(own_tried)) > 3
    # The same rules fired: the same graph either way.
    assert patched_ops == own_ops
    torch.testing.assert_close(patched_out, expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(own_out, expected, atol=1e-5, rtol=1e-5)


def test_the_patched_matcher_answers_as_onnxscripts_own_on_every_node():
    """A multi-output rule (``SlicesSplit``: two ``Slice`` of one input) matched from each node of a graph: the
    patched matcher finds the same nodes as onnxscript's own, and refuses the same nodes."""
    import onnx_ir as ir
    from onnx import parser
    from onnxscript.rewriter._matcher import SimplePatternMatcher
    from onnxscript.rewriter.rules.common._basic_rules import SlicesSplit

    from hfexport_onnx.workarounds import onnx_patches

    original = SimplePatternMatcher.match
    patched = getattr(onnx_patches, MATCH_PATCH)(original)
    model = ir.from_proto(parser.parse_model("""<ir_version: 10, opset_import: ["" : 18]>
        halves (float[2, 8] x) => (float[2, 4] y) <int64[1] b0 = {0}, int64[1] e0 = {4}, int64[1] e1 = {8},
                                                   int64[1] axes = {-1}> {
            t = Tanh(x)
            left = Slice(t, b0, e0, axes)
            right = Slice(t, e0, e1, axes)
            product = Mul(left, right)
            y = Add(product, left)
        }"""))
    matcher = SimplePatternMatcher(SlicesSplit().rule()._target_pattern)
    assert not matcher.pattern.has_single_output_node
    answers = {}
    for node in model.graph:
        own = original(matcher, model, model.graph, node)
        ours = patched(matcher, model, model.graph, node)
        answers[node.op_type] = bool(ours)
        assert bool(ours) == bool(own), node.op_type
        assert [n.name for n in ours.nodes] == [n.name for n in own.nodes], node.op_type
    assert answers == {"Tanh": False, "Slice": True, "Mul": False, "Add": False}


class SortedLookup(torch.nn.Module):
    """``aten.searchsorted``: translated only by hfexport's ``_aten_searchsorted`` (torchlib has none)."""

    def forward(self, sequence, values):
        return torch.searchsorted(sequence, values) * 2


def test_the_torchlib_registry_is_built_once_per_process(monkeypatch):
    """torch.onnx builds its torchlib registry (the IR of onnxscript's ~500 functions, from their source) on every
    ``torch.onnx.export``, and ``lower`` asks for one more for its decomposition step; the pipeline
    (``_torch_onnx.torch_onnx_pipeline``, entered by ``lower``) builds it once per process. Each caller gets its
    own copy: the translation one export adds (``_aten_searchsorted``, through ``custom_translation_table``) is not in
    the next export's registry, which then fails as an export without the translation does. The same graph and
    outputs as with a registry built for each call."""
    from torch.onnx._internal._lazy_import import onnxscript_apis  # what from_torchlib calls, once per build

    from hfexport_onnx import _torch_onnx

    builds: list[int] = []
    original = onnxscript_apis.get_torchlib_ops
    monkeypatch.setattr(onnxscript_apis, "get_torchlib_ops", lambda: builds.append(1) or original())
    model = SortedLookup()
    inputs = {"sequence": torch.tensor([[0.0, 1.0, 2.0, 4.0]]), "values": torch.tensor([[-1.0, 1.5, 3.0, 9.0]])}
    expected = model(**inputs)

    exports = {}
    for label, built_once in (("torch's own", lambda original: original), ("built once", _torch_onnx._built_once)):
        counts = []
        with monkeypatch.context() as m:
            m.setattr(_torch_onnx, "_built_once", built_once)
            for _ in range(2):
                builds.clear()
                exported = hfexport.export(model, inputs, backend="onnx")
                counts.append(len(builds))
        graph = onnx.load(str(exported.runner.path), load_external_data=False).graph
        exports[label] = (counts, [node.op_type for node in graph.node], exported(**inputs))
        assert torch.equal(exports[label][2], expected), label
    assert exports["torch's own"][0] == [2, 2]  # the decomposition step's and torch.onnx.export's
    assert exports["built once"][0][1] == 0  # the second export builds nothing (the first may: another module's ops)
    assert exports["built once"][1] == exports["torch's own"][1]
    with pytest.raises(hfexport.ExportError, match=r"No ONNX function found for <OpOverload\(op='aten.searchsorted'"):
        hfexport.export(model, inputs, backend="onnx", disable=("_aten_searchsorted",))
    assert builds == [], "the cached registry was built again"
