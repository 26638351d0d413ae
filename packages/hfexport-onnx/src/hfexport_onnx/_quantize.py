"""``OnnxConfig(quantize=...)``: ONNX Runtime's int8/int4 quantization of the exported model, the last step of stage 5.

It runs after the IR fixes, the onnxscript optimizer and the ORT fusions (the quantizer then sees folded constants:
a ``MatMul`` whose weight is an initializer, not a ``Transpose`` of one) and before the ONNX Runtime session is
opened on the result. Only ``MatMul``/``Gemm`` with a constant weight and ``Gather`` of a constant table (the
embeddings) are quantized; LayerNorm, softmax, the fused ``MultiHeadAttention`` and attention's
activation-by-activation ``MatMul`` stay float32 (``MatMulConstBOnly``). Four recipes:

- ``"int8-dynamic"`` (default ``group_size=128``) — the steps ``onnxruntime.quantization.MatMulNBitsQuantizer``
  then ``onnxruntime.quantization.quantize_dynamic``. Every ``MatMul`` with a constant weight becomes
  ``MatMulNBits(bits=8, block_size=group_size, accuracy_level=4)``: int8 weights, symmetric, one scale per
  ``group_size`` input weights of each output channel; ``accuracy_level=4`` makes MLAS quantize the activation to
  int8 at run time *per row and per block* of the same size and run an int8 dot-product GEMM (VNNI on x86, SDOT on
  ARM). ``quantize_dynamic`` then quantizes what ``MatMulNBits`` does not take (embedding tables int8; a ``Gemm``,
  such as BERT's pooler, as in the next recipe). ``group_size`` is 16, 32, 64, 128 or 256.
- ``"int4"`` (default ``group_size=32``) — the same two steps with ``MatMulNBits(bits=4, block_size=group_size,
  accuracy_level=4)``, symmetric: what ONNX Runtime GenAI's model builder writes for int4 (block 32, accuracy level
  4), for decoders. **Why the rest still goes through** ``quantize_dynamic`` (embedding tables int8; the builder
  keeps them float): on the tiny Llama of ``tests/helpers.py`` (4 x 24 random tokens, logits against float eager)
  it costs nothing measurable (cosine 0.99536 without, 0.99535 with; top-1 0.84 / 0.85, noise of near-tied
  logits) and saves the float table: the artifact is 77.9% of float without, 75.6% with; at hidden 256, vocab 4000
  the table is half of an int4 artifact (41.5% of float without, 20.0% with, cosine 0.9782 / 0.9781). On the same
  tiny Llama ``int8-dynamic`` keeps cosine 0.99993, top-1 0.98, at 89.4% (a tiny model's file is mostly graph).
  A tied table (an LM head that reads the embedding table transposed) is quantized once, as the head's
  ``MatMulNBits`` weights, and the embedding gathers rows of those (``GatherBlockQuantized``,
  :func:`share_tied_tables`), as GenAI's builder does: no int8 copy beside the int4 head.
- ``"int8-dynamic-per-tensor"`` — ``quantize_dynamic`` alone (QOperator, the only form it writes: QDQ is static
  quantization's): ``MatMul`` weights int8 per output channel, activations uint8 *one scale per tensor* at run time
  (``DynamicQuantizeLinear`` -> ``MatMulInteger``, fused by ORT into ``DynamicQuantizeMatMul``, MLAS's u8s8 GEMM),
  embedding tables int8. The fastest on a VNNI CPU, the least accurate.
- ``"int8-static"`` — ``quantize_static`` in the QDQ format (``QuantizeLinear``/``DequantizeLinear`` pairs that
  ORT's CPU provider fuses into ``QLinearMatMul``): weights int8 per output channel, activations uint8 one scale per
  tensor with ranges observed (MinMax) on calibration inputs, ``Quantization("int8-static", calibration=[...])``,
  by default the export's own inputs (the user's, or the dummy inputs built from the config).

**Why int8-dynamic is blockwise** (all-MiniLM-L6-v2, the 16 sentences of ``tests/quantization_helpers.py``,
sentence embeddings' cosine with float eager, mean / worst; size of the float artifact; latency 1 x 128, one
thread, float 35 ms, on an AVX-512 VNNI CPU):

=====================================================  ===============  ======  ========
QOperator per tensor (``int8-dynamic-per-tensor``)      0.9923 / 0.9861   25.6%  2.2x
  ... weights per tensor too                             0.9621 / 0.9332   25.5%
  ... ``reduce_range`` (7-bit weights)                   0.82
  ... symmetric activations                              0.9919 / 0.9868
  ... FFN up projections left float                      0.9955 / 0.9929   37.2%
  ... FFN down projections left float                    0.9956 / 0.9918   37.2%
  ... first or last layer left float                     0.994 / 0.988     31.4%
``MatMulNBits`` 8-bit, block 128 (``int8-dynamic``)      0.9987 / 0.9975   25.8%  1.3-1.4x
  ... block 64                                           0.9990 / 0.9983   26.2%  1.3x
  ... block 256                                          0.9977 / 0.9948   28.3%
  ... FFN only, QOperator elsewhere                      0.9977 / 0.9955   25.8%  1.5x
``quantize_static`` QDQ u8s8 MinMax (``int8-static``)   0.94 / 0.91       25.7%  2x
  ... every op type (add, LayerNorm, ...)                0.84 / 0.73
  ... Percentile / Entropy calibration                   0.94 / 0.93 ; 0.94 / 0.91
  ... FFN down projections left float                    0.991 / 0.986     37.8%
=====================================================  ===============  ======  ========

The error of ``int8-dynamic-per-tensor`` is spread over every layer and every projection (leaving one layer, or
one kind of projection, float gains at most 0.007 at the worst sentence; the shortest sentence, "Short.", is the
worst in every variant, alone or in a padded batch): a per-tensor activation scale is set by a few outlier channels
(the LayerNorm outputs feeding the projections, the one-sided GELU output feeding the FFN's down projection), and
no exclusion within 35% of the size reaches 0.99. Blockwise activation scales do: ``MatMulNBits`` at block 128 keeps
every sentence at >= 0.997 for 0.2 points of size and some speed (MLAS's blockwise int8 GEMM is slower than its
per-tensor one at 128 rows). Static per-tensor ranges fit worse still (the activations of the calibration inputs
bound those of other sentences badly): ``int8-static`` is for models and execution providers that need a static
QDQ graph; s8s8 QDQ (int8 activations) runs 3x slower than u8s8 on ORT's CPU provider, hence uint8 activations.
``reduce_range`` (7-bit weights, for CPUs without VNNI) costs more accuracy still, so it is off everywhere.
"""

from __future__ import annotations

import contextlib
import logging
import tempfile
from collections import Counter
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnx_ir as ir

from hfexport import Quantization
from hfexport.plugin import ExportContext
from hfexport.quantization import QuantizationRecipe, file_bytes, resolve_quantization, weight_bytes

__all__ = ["ONNX_QUANTIZATION_RECIPES", "quantization_section", "quantize_model", "resolve_onnx_quantization"]

# Default verification thresholds (cosine of the main output with float eager on the export's inputs), below what
# was measured: all-MiniLM-L6-v2's last_hidden_state (its sentence embeddings in the table above) at 0.996
# (int8-dynamic), 0.97-0.98 (per tensor), 0.90 (static); a tiny random Llama's logits at 0.99 (int4: 0.995, 0.978
# at hidden 256; int4 is ExecuTorch's 8da4w's 0.9). A broken quantization lands far below.
ONNX_QUANTIZATION_RECIPES: dict[str, QuantizationRecipe] = {
    "int8-dynamic": QuantizationRecipe(
        "int8-dynamic", "ONNX Runtime MatMulNBits (bits=8, accuracy_level=4): MatMul weights int8 in blocks of "
        "group_size input weights, activations int8 per row and block at run time; embedding tables int8",
        min_cosine=0.98, options=("group_size", "symmetric"), default_group_size=128),
    "int4": QuantizationRecipe(
        "int4", "ONNX Runtime MatMulNBits (bits=4, accuracy_level=4), as ONNX Runtime GenAI's model builder writes "
        "it: MatMul weights int4 in blocks of group_size input weights, activations int8 per row and block at run "
        "time; embedding tables int8", min_cosine=0.9, options=("group_size", "symmetric"), default_group_size=32),
    "int8-dynamic-per-tensor": QuantizationRecipe(
        "int8-dynamic-per-tensor", "ONNX Runtime dynamic int8 (QOperator): MatMul weights int8 per output channel, "
        "activations uint8 per tensor at run time, embedding tables int8", min_cosine=0.95),
    "int8-static": QuantizationRecipe(
        "int8-static", "ONNX Runtime static int8 (QDQ): MatMul weights int8 per output channel, activations uint8 "
        "per tensor calibrated on the export's inputs (or calibration=), embedding tables int8",
        min_cosine=0.85, options=("calibration",)),
}
_NBITS, _DYNAMIC, _STATIC = ("onnxruntime.quantization.MatMulNBitsQuantizer",
                             "onnxruntime.quantization.quantize_dynamic", "onnxruntime.quantization.quantize_static")
_QUANTIZED_OPS = ("MatMul", "Gemm", "Gather")
_NBITS_BITS = {"int8-dynamic": 8, "int4": 4}  # the MatMulNBits recipes and their weights' bit width


def resolve_onnx_quantization(value: Any) -> Quantization | None:
    """``OnnxConfig.quantize`` resolved (:func:`hfexport.quantization.resolve_quantization`).

    Raises:
        ValueError: a recipe the backend does not support (naming those it does), an option the recipe does not
            take, or an ``int8-dynamic``/``int4`` ``group_size`` other than 16, 32, 64, 128, 256 (``MatMulNBits``'s
            ``block_size``: ONNX Runtime's blockwise quantization takes no other).
    """
    quantization = resolve_quantization(value, ONNX_QUANTIZATION_RECIPES, "backend 'onnx'")
    size = quantization.group_size if quantization is not None else None
    if size is not None and size not in (16, 32, 64, 128, 256):
        raise ValueError(f"{quantization.recipe} group_size (input weights per scale, MatMulNBits' block_size) must "
                         f"be 16, 32, 64, 128 or 256 (ONNX Runtime's blockwise quantization takes no other), got {size}")
    return quantization


@contextlib.contextmanager
def _quiet_quantizer() -> Iterator[None]:
    """ONNX Runtime's quantizers log on the root logger at every call ("consider to run pre-processing", types they
    cannot infer for contrib ops such as ``MultiHeadAttention``, which they leave float anyway); errors still show."""
    root = logging.getLogger()
    level = root.level
    root.setLevel(max(level, logging.ERROR))
    try:
        yield
    finally:
        root.setLevel(level)


def _import_matmul_nbits_quantizer() -> Any:
    """Import ``onnxruntime.quantization.matmul_nbits_quantizer`` without the logging set-up it does at import.

    **Why**: the module calls ``logging.basicConfig(level=logging.INFO)`` at import time: the root logger of the
    user's process gets a stderr handler and INFO level, and every library's INFO lines print from then on.
    The handler it adds is removed and the root level put back.
    **Upstream**: microsoft/onnxruntime ``onnxruntime/python/tools/quantization/matmul_nbits_quantizer.py``
    (module-level ``logging.basicConfig``; seen in 1.32).
    **Remove when**: the module no longer configures logging when imported.
    """
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    from onnxruntime.quantization import matmul_nbits_quantizer

    for handler in [h for h in root.handlers if h not in handlers]:
        root.removeHandler(handler)
    root.setLevel(level)
    return matmul_nbits_quantizer


def quantize_model(ctx: ExportContext, model: ir.Model, quantization: Quantization,
                   input_leaves: list[str | None]) -> tuple[ir.Model, dict[str, Any]]:
    """``model`` quantized with ``quantization`` (the export's config; see the module docstring for the steps of
    each recipe), and what was quantized and the sizes (the manifest's ``quantization`` section).
    ``input_leaves`` names the graph input of each flattened input leaf (None: not a graph input), for the
    calibration feeds.

    The model goes through files (ORT's quantizers read and write them), its weights as external data, so that
    models past protobuf's 2 GB limit quantize too; the result is read back into memory, its tables inlined.
    """
    # a tied head reads its table transposed (FusedMatMul): MatMul again, so that MatMulNBits quantizes it
    untransposed = matmuls_over_transposed_weights(model) if quantization.recipe in _NBITS_BITS else {}
    with tempfile.TemporaryDirectory(prefix="hfexport-quantize-") as tmp:
        source, target = Path(tmp) / "float.onnx", Path(tmp) / "quantized.onnx"
        ir.save(model, source, external_data="float.onnx.data")
        float_size = file_bytes([source, Path(tmp) / "float.onnx.data"])
        with _quiet_quantizer():
            if quantization.recipe == "int8-static":
                details = _static(ctx, quantization, source, target, input_leaves)
            else:
                details = _dynamic(ctx, quantization, source, target)
        quantized_size = file_bytes(list(Path(tmp).glob("quantized.onnx*")))
        proto = onnx.load(str(target))  # external data read into memory: the temporary directory goes
    quantized = ir.serde.deserialize_model(proto)
    shared, freed = share_tied_tables(quantized, untransposed) if untransposed else (0, 0)
    quantized_size -= freed
    section = {
        "recipe": quantization.recipe, **details, **_census(quantized),
        "size_bytes": {"float_weights": weight_bytes(ctx.model), "float_onnx": float_size,
                       "quantized_onnx": quantized_size, "ratio": round(quantized_size / max(float_size, 1), 4)},
        "min_cosine": quantization.min_cosine,
        "transposed_weights_untied": len(untransposed),
        "tied_tables_shared": shared,  # embeddings reading the head's quantized table (GatherBlockQuantized)
    }
    quantized.metadata_props["pkg.hfexport.quantization"] = quantization.recipe
    return quantized, section


def matmuls_over_transposed_weights(model: ir.Model) -> dict[str, str]:
    """Rewrite in place each ``FusedMatMul(A, W, transB=1)`` over a constant ``W`` as ``MatMul(A, W^T)``, ``W^T`` an
    initializer of its own; returns the name of each ``W^T`` and of the ``W`` it copies. A tied LM head reads the embedding table ``[vocab, hidden]`` this way
    (the float graph stores the table once), and ONNX Runtime's ``MatMulNBitsQuantizer`` quantizes ``MatMul`` only:
    left float, the head of the Qwen2-0.5B-shaped decoder (136 M parameters) made its int4 decode step as slow as the
    float one (133 against 134 ms near 64 positions, ORT GenAI int4: 33 ms). The table itself stays for the
    embedding's ``Gather`` until :func:`share_tied_tables` makes it read the head's quantized copy."""
    rewritten: dict[str, str] = {}
    for node in list(model.graph):
        if node.op_type != "FusedMatMul" or node.domain != "com.microsoft" or len(node.inputs) != 2:
            continue
        attributes = node.attributes
        if (attributes.get_int("transB", 0) != 1 or attributes.get_int("transA", 0)
                or attributes.get_int("transBatchA", 0) or attributes.get_int("transBatchB", 0)
                or attributes.get_float("alpha", 1.0) != 1.0):
            continue
        data, weight = node.inputs
        if data is None or weight is None or weight.const_value is None or len(weight.const_value.shape) != 2:
            continue
        array = np.ascontiguousarray(weight.const_value.numpy().T)
        transposed = ir.Value(name=f"{weight.name}.transposed", shape=ir.Shape(array.shape), type=weight.type,
                              const_value=ir.tensor(array, name=f"{weight.name}.transposed"))
        model.graph.register_initializer(transposed)
        matmul = ir.node("MatMul", [data, transposed], name=f"{node.name}.unfused" if node.name else None)
        ir.convenience.replace_nodes_and_values(model.graph, node, [node], [matmul], node.outputs, matmul.outputs)
        rewritten[str(transposed.name)] = str(weight.name)
    return rewritten


def share_tied_tables(model: ir.Model, copies: Mapping[str, str]) -> tuple[int, int]:
    """Make each embedding ``Gather`` of a tied table read the LM head's ``MatMulNBits`` weights instead of a table
    of its own: ``GatherBlockQuantized`` (ONNX Runtime's contrib op) over the head's packed ``B``, then a reshape to
    ``[..., hidden]``. Returns how many, and the bytes of the initializers it removed (the int8 tables). The table
    is then stored once, as ONNX Runtime GenAI's builder stores it.

    ``copies`` maps each transposed copy to its table (:func:`matmuls_over_transposed_weights`); the quantizer names
    a head's ``B`` after its weight (``<copy>_Q4``). ``B`` is ``[vocab, hidden / block, block * bits / 8]``: the rows
    of the table, each in blocks of ``block`` values packed low nibble first, which is ``GatherBlockQuantized``'s
    layout for ``uint8`` data over ``quantize_axis=2`` (its default zero point, 8 for 4 bits and 128 for 8 bits, is
    ``MatMulNBits``'s for symmetric weights: ONNX Runtime's gather_block_quantized_op_test.cc). Left alone: a head
    with zero points (asymmetric), a hidden size that is not a multiple of the block, a ``Gather`` of the table
    whose result feeds anything but one ``DequantizeLinear`` (``quantize_dynamic``'s int8 table) when quantized.

    Measured on the tied tiny Llama of ``tests/onnx/test_onnx_quantization.py`` (vocab 1,024, hidden 32): the
    gathered rows equal the head's int4 weights dequantized by hand (max abs diff 0.0); logits cosine 0.9963 with the
    int8-table graph.
    """
    graph = model.graph
    heads: dict[str, ir.Node] = {}
    for node in graph:
        if node.op_type == "MatMulNBits" and node.domain == "com.microsoft" and len(node.inputs) == 3:
            name = node.inputs[1].name if node.inputs[1] is not None else None
            table = next((t for copy, t in copies.items() if name and name.startswith(f"{copy}_")), None)
            if table is not None:
                heads[table] = node
    shared = 0
    for node in list(graph):
        data = node.inputs[0] if node.op_type == "Gather" and node.domain == "" and node.inputs else None
        table = next((t for t in heads if data is not None and data.name in (t, f"{t}_quantized")), None)
        if table is None or node.attributes.get_int("axis", 0) != 0:
            continue
        removed, output = [node], node.outputs[0]
        if data.name != table:  # quantize_dynamic's int8 table: Gather, then DequantizeLinear
            users = list(output.uses())
            if len(users) != 1 or users[0].node.op_type != "DequantizeLinear":
                continue
            removed.append(users[0].node)
            output = users[0].node.outputs[0]
        head = heads[table]
        packed, scales = head.inputs[1], head.inputs[2]
        bits, block = head.attributes.get_int("bits", 4), head.attributes.get_int("block_size", 0)
        rows, hidden = head.attributes.get_int("N", 0), head.attributes.get_int("K", 0)
        if not block or hidden % block or packed.shape is None                 or list(packed.shape) != [rows, hidden // block, block * bits // 8]:
            continue
        new_shape = _constant(graph, f"{table}.scales_shape", [rows, hidden // block, 1])
        reshaped_scales = ir.node("Reshape", [scales, new_shape])
        gathered = ir.node("GatherBlockQuantized", [packed, node.inputs[1], reshaped_scales.outputs[0]],
                           attributes={"gather_axis": 0, "quantize_axis": 2, "block_size": block, "bits": bits},
                           domain="com.microsoft")
        ids_shape = ir.node("Shape", [node.inputs[1]])
        target = ir.node("Concat", [ids_shape.outputs[0], _constant(graph, f"{table}.hidden", [hidden])],
                         attributes={"axis": 0})
        rows_out = ir.node("Reshape", [gathered.outputs[0], target.outputs[0]])
        ir.convenience.replace_nodes_and_values(graph, node, removed,
                                                [reshaped_scales, gathered, ids_shape, target, rows_out],
                                                [output], rows_out.outputs)
        shared += 1
    freed = 0
    if shared:
        used = {v.name for n in ir.traversal.RecursiveGraphIterator(graph) for v in n.inputs if v is not None}
        for name in [n for n in graph.initializers if n not in used]:  # the int8 table, its scale and zero point
            tensor = graph.initializers[name].const_value
            freed += tensor.nbytes if tensor is not None else 0
            del graph.initializers[name]
        if "com.microsoft" not in model.opset_imports:
            model.opset_imports["com.microsoft"] = 1
    return shared, freed


def _constant(graph: ir.Graph, name: str, values: list[int]) -> ir.Value:
    value = ir.Value(name=name, const_value=ir.tensor(np.array(values, dtype=np.int64), name=name))
    graph.register_initializer(value)
    return value


def _dynamic(ctx: ExportContext, quantization: Quantization, source: Path, target: Path) -> dict[str, Any]:
    """``int8-dynamic`` and ``int4`` (``MatMulNBits`` with 8- or 4-bit weights, then ``quantize_dynamic`` on the
    rest) and ``int8-dynamic-per-tensor`` (``quantize_dynamic`` alone)."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    steps, bits = [], _NBITS_BITS.get(quantization.recipe)
    if bits is not None:
        nbits_quantizer = _import_matmul_nbits_quantizer()
        block, nbits = int(quantization.group_size or 128), source.with_name("nbits.onnx")
        symmetric = quantization.symmetric is not False  # MatMulNBits' is_symmetric; default True
        with ctx.step(_NBITS):
            config = nbits_quantizer.DefaultWeightOnlyQuantConfig(block_size=block, is_symmetric=symmetric,
                                                                  accuracy_level=4, bits=bits)
            quantizer = nbits_quantizer.MatMulNBitsQuantizer(str(source), algo_config=config)
            quantizer.process()
            quantizer.model.save_model_to_file(str(nbits), use_external_data_format=True)
        source, steps = nbits, [f"{_NBITS}(bits={bits}, block_size={block}, is_symmetric={symmetric}, "
                                f"accuracy_level=4)"]
    with ctx.step(_DYNAMIC):
        quantize_dynamic(source, target, per_channel=True, reduce_range=False, weight_type=QuantType.QInt8,
                         use_external_data_format=True, extra_options={"MatMulConstBOnly": True})
    steps.append(f"{_DYNAMIC}(per_channel=True, weight_type=QInt8, MatMulConstBOnly)")
    if bits is not None:
        return {"steps": steps, "group_size": block,
                "format": f"MatMulNBits (contrib op, bits={bits}, accuracy_level=4: MLAS int8 GEMM); QOperator "
                          "(DynamicQuantizeLinear + MatMulInteger) for a Gemm; int8 tables dequantized after Gather",
                "weights": f"int{bits}, {'symmetric' if symmetric else 'asymmetric (a zero point per block)'}, one "
                           f"scale per {block} input weights of each output channel; "
                           "embedding tables int8, a table tied to the head read from the head's weights",
                "activations": f"int8, per row and per block of {block}, at run time (accuracy_level=4)"}
    return {"steps": steps,
            "format": "QOperator (DynamicQuantizeLinear + MatMulInteger; ORT fuses them into DynamicQuantizeMatMul)",
            "weights": "int8, symmetric, per output channel; embedding tables int8",
            "activations": "uint8, asymmetric, per tensor, at run time"}


def _static(ctx: ExportContext, quantization: Quantization, source: Path, target: Path,
            input_leaves: list[str | None]) -> dict[str, Any]:
    """``int8-static``: ``quantize_static`` (QDQ, MinMax) calibrated on the calibration batches."""
    from onnxruntime.quantization import (
        CalibrationDataReader,
        CalibrationMethod,
        QuantFormat,
        QuantType,
        quantize_static,
    )

    graph_inputs = [i.name for i in onnx.load(str(source), load_external_data=False).graph.input]
    feeds = _calibration_feeds(ctx, quantization, graph_inputs, input_leaves)

    class _Batches(CalibrationDataReader):
        def __init__(self) -> None:
            self.batches = iter(feeds)

        def get_next(self) -> dict[str, Any] | None:
            return next(self.batches, None)

    with ctx.step(_STATIC):
        quantize_static(source, target, _Batches(), quant_format=QuantFormat.QDQ, op_types_to_quantize=list(
                            _QUANTIZED_OPS), per_channel=True, reduce_range=False, activation_type=QuantType.QUInt8,
                        weight_type=QuantType.QInt8, calibrate_method=CalibrationMethod.MinMax,
                        use_external_data_format=True,
                        extra_options={"MatMulConstBOnly": True, "CalibTensorRangeSymmetric": False})
    return {"steps": [f"{_STATIC}(QDQ, per_channel=True, activations QUInt8, weights QInt8, MinMax, "
                      "MatMulConstBOnly)"],
            "format": "QDQ (QuantizeLinear/DequantizeLinear around each MatMul, Gemm and Gather; ORT fuses them "
                      "into QLinearMatMul)",
            "weights": "int8, symmetric, per output channel; embedding tables int8",
            "activations": "uint8, asymmetric, per tensor, ranges observed (MinMax) on the calibration inputs",
            "calibration": {"batches": len(feeds), "source": "calibration=" if quantization.calibration
                            else "the export's inputs"}}


def _calibration_feeds(ctx: ExportContext, quantization: Quantization, graph_inputs: list[str],
                       leaves_names: list[str | None]) -> list[dict[str, Any]]:
    """The calibration batches (the export's inputs by default) as ONNX Runtime feeds: each flattened like the
    export's inputs and named by the graph inputs (``leaves_names``), floating tensors in the graph's
    dtype. A batch leaves out no tensor input (``check_quantization_inputs`` refused that before any stage); a
    non-tensor input it leaves out is the export's."""
    import numpy as np
    import torch
    import torch.utils._pytree as pytree

    batches: list[Mapping[str, Any]] = list(quantization.calibration or [ctx.inputs])
    like = pytree.tree_leaves(dict(ctx.inputs))
    feeds = []
    for batch in batches:
        leaves = pytree.tree_leaves({name: batch.get(name, value) for name, value in ctx.inputs.items()})
        feed = {}
        for name, leaf, ref in zip(leaves_names, leaves, like, strict=True):
            if name is None or name not in graph_inputs:
                continue
            array = torch.as_tensor(leaf).detach().cpu()
            if isinstance(ref, torch.Tensor) and array.is_floating_point():
                array = array.to(ref.dtype)
            feed[name] = np.ascontiguousarray(array.numpy())
        feeds.append(feed)
    return feeds


def _census(model: ir.Model) -> dict[str, Any]:
    """What the quantized graph holds: quantized ``MatMul``/``Gemm`` and ``Gather`` nodes, in any of the three
    forms, and the ``MatMul``/``Gemm``/``FusedMatMul`` with a constant weight left float."""
    nodes = list(ir.traversal.RecursiveGraphIterator(model.graph))
    ops = Counter(node.op_type for node in nodes)

    def dequantized(value: ir.Value | None) -> bool:
        producer = value.producer() if value is not None else None
        return (producer is not None and producer.op_type == "DequantizeLinear") or (
            value is not None and value.dtype in (ir.DataType.INT8, ir.DataType.UINT8))

    def weight(node: ir.Node) -> ir.Value | None:
        return node.inputs[1] if len(node.inputs) > 1 else None

    qdq_matmuls = sum(1 for n in nodes if n.op_type in ("MatMul", "Gemm") and dequantized(weight(n)))
    gathers = sum(1 for n in nodes if n.op_type == "Gather" and n.inputs and dequantized(n.inputs[0])) \
        + ops.get("GatherBlockQuantized", 0)
    kept_float = sum(1 for n in nodes if n.op_type in ("MatMul", "Gemm", "FusedMatMul") and weight(n) is not None
                     and weight(n).is_initializer() and weight(n).dtype == ir.DataType.FLOAT)
    matmuls = ops.get("MatMulNBits", 0) + ops.get("MatMulInteger", 0) + qdq_matmuls
    int8_tensors = sum(1 for v in model.graph.initializers.values()
                       if v.const_value is not None and v.dtype in (ir.DataType.INT8, ir.DataType.UINT8))
    return {"quantized": {"MatMul": matmuls, "Gather": gathers}, "int8_tensors": int8_tensors,
            "kept_float": {"MatMul with a constant weight": kept_float}}


def quantization_section(section: dict[str, Any] | None) -> dict[str, Any]:
    """The component manifest's ``quantization`` key (empty for a float export)."""
    return {"quantization": section} if section else {}
