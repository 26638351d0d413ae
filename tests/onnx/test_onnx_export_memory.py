"""An ONNX export holds about one copy of the weights beside the model (issue 44): the packed projections are
computed as ``model.onnx.data`` is written (``_fusions.pack_shared_input_matmuls``), and the session the export
verifies reads the weights where ONNX Runtime maps them, without its packed copy (``OnnxRunner.from_model``).
``benchmarks/bench_export_memory.py --backend onnx`` measures the same at a few hundred MB and at 0.5 B."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from hfexport_onnx._fusions import _JoinedTensor, pack_shared_input_matmuls


def _three_matmuls() -> tuple[ir.Model, list[np.ndarray]]:
    """``x @ w0``, ``x @ w1``, ``x @ w2`` summed: three constant weights that multiply one input."""
    rng = np.random.default_rng(0)
    weights = [rng.standard_normal((8, n)).astype(np.float32) for n in (8, 4, 4)]
    x = ir.Value(name="x", shape=ir.Shape([2, 8]), type=ir.TensorType(ir.DataType.FLOAT))
    graph = ir.Graph([x], [], nodes=[], opset_imports={"": 18}, name="g")
    outputs = []
    for i, array in enumerate(weights):
        w = ir.Value(name=f"w{i}", shape=ir.Shape(array.shape), type=ir.TensorType(ir.DataType.FLOAT),
                     const_value=ir.tensor(array, name=f"w{i}"))
        graph.register_initializer(w)
        node = ir.node("MatMul", [x, w])
        node.outputs[0].shape, node.outputs[0].type = ir.Shape([2, array.shape[1]]), x.type
        graph.append(node)
        outputs.append(node.outputs[0])
    concat = ir.node("Concat", outputs, attributes={"axis": -1})
    graph.append(concat)
    graph.outputs.append(concat.outputs[0])
    return ir.Model(graph, ir_version=10), weights


def test_packed_weights_are_joined_when_written(tmp_path, monkeypatch) -> None:
    """The joined weight is an ``ir.LazyTensor`` (no copy held until ``model.onnx.data`` is written, then written a
    block of rows at a time: here one row), and the file holds the weights joined along the output dim."""
    monkeypatch.setattr(_JoinedTensor, "BLOCK_BYTES", 1)
    model, weights = _three_matmuls()
    assert pack_shared_input_matmuls(model) == 2
    packed = [v for v in model.graph.initializers.values() if v.name.endswith("_packed3")]
    assert len(packed) == 1 and isinstance(packed[0].const_value, ir.LazyTensor)
    assert packed[0].shape == ir.Shape([8, 16]) and packed[0].const_value.dtype == ir.DataType.FLOAT
    ir.save(model, tmp_path / "model.onnx", external_data="model.onnx.data", size_threshold_bytes=0)
    loaded = ir.load(tmp_path / "model.onnx")
    joined = np.concatenate(weights, axis=1)
    np.testing.assert_array_equal(loaded.graph.initializers[packed[0].name].const_value.numpy(), joined)
    np.testing.assert_array_equal(packed[0].const_value.numpy(), joined)
