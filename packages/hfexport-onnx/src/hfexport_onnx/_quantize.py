"""``OnnxConfig(quantize="int8-dynamic")``: ONNX Runtime's dynamic int8 quantization of the exported model.

Stage 5 runs it as the step ``onnxruntime.quantization.quantize_dynamic``, after the IR fixes and the onnxscript
optimizer (the quantizer then sees folded constants: a ``MatMul`` whose weight is an initializer, not a
``Transpose`` of one) and before the ONNX Runtime session is opened on the result.

What ``int8-dynamic`` does: every ``MatMul`` whose second input is a constant weight gets int8 weights, one scale
per output channel (symmetric), and its activation is quantized to uint8 at run time, one scale per tensor
(``DynamicQuantizeLinear`` -> ``MatMulInteger``); every ``Gather`` of a constant table (the embeddings) gets an
int8 table dequantized after the lookup. The rest of the graph (LayerNorm, softmax, attention's activation-by-
activation MatMuls) stays float32.

**QOperator, not QDQ.** ONNX Runtime's dynamic quantization writes the QOperator form (``quantize_dynamic`` has no
QDQ mode: QDQ is the format of static quantization, for execution providers that fuse ``QuantizeLinear`` /
``DequantizeLinear`` pairs themselves). On the CPU provider the QOperator form is the fast one: ORT's graph
optimizer fuses ``DynamicQuantizeLinear`` + ``MatMulInteger`` + the scale ``Mul`` into ``DynamicQuantizeMatMul``,
which runs MLAS's u8s8 int8 GEMM (VNNI where the CPU has it).

**Per channel.** Per-tensor weight scales lose too much on BERT-style encoders (all-MiniLM-L6-v2: sentence
embeddings at cosine 0.94 with float, against 0.99 per channel); ``reduce_range`` (7-bit weights, for CPUs without
VNNI) costs more still (0.82), so it is off.
"""

from __future__ import annotations

import contextlib
import logging
import tempfile
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import onnx
import onnx_ir as ir

from hfexport.plugin import ExportContext, Quantization, QuantizationRecipe, file_bytes, weight_bytes

__all__ = ["ONNX_QUANTIZATION_RECIPES", "quantization_section", "quantize_model"]

ONNX_QUANTIZATION_RECIPES: dict[str, QuantizationRecipe] = {
    "int8-dynamic": QuantizationRecipe(
        "int8-dynamic", "ONNX Runtime dynamic int8 (QOperator): MatMul weights int8 per output channel, activations "
        "uint8 per tensor at run time, embedding tables int8",
        # Measured: all-MiniLM-L6-v2's last_hidden_state at 0.97-0.98 (its mean-pooled sentence embeddings at
        # 0.99); a tiny random Llama's logits at 0.99. A broken quantization lands far below.
        min_cosine=0.95),
}
_STEP = "onnxruntime.quantization.quantize_dynamic"


@contextlib.contextmanager
def _quiet_quantizer() -> Iterator[None]:
    """ONNX Runtime's quantizer logs a root-logger warning on every call ("consider to run pre-processing"): the
    pre-processing it means (shape inference, ORT graph optimizations) is for static quantization's calibration."""
    root = logging.getLogger()
    level = root.level
    root.setLevel(max(level, logging.ERROR))
    try:
        yield
    finally:
        root.setLevel(level)


def quantize_model(ctx: ExportContext, model: ir.Model) -> ir.Model:
    """``model`` quantized with ``ctx.config.quantize`` (the step ``onnxruntime.quantization.quantize_dynamic``);
    records what was quantized and the sizes in ``ctx.extras["onnx_quantization"]`` (the manifest's
    ``quantization`` section).

    The model goes through files (ORT's quantizer reads and writes them), its weights as external data, so that
    models past protobuf's 2 GB limit quantize too; the result is read back into memory, its tables inlined.
    """
    from onnxruntime.quantization import QuantType, quantize_dynamic

    quantization: Quantization = ctx.config.quantize  # type: ignore[attr-defined]
    with tempfile.TemporaryDirectory(prefix="hfexport-quantize-") as tmp:
        source, target = Path(tmp) / "float.onnx", Path(tmp) / "int8.onnx"
        ir.save(model, source, external_data="float.onnx.data")
        float_size = file_bytes([source, Path(tmp) / "float.onnx.data"])
        with ctx.step(_STEP), _quiet_quantizer():
            quantize_dynamic(source, target, per_channel=True, reduce_range=False, weight_type=QuantType.QInt8,
                             use_external_data_format=True, extra_options={"MatMulConstBOnly": True})
        quantized_size = file_bytes(list(Path(tmp).glob("int8.onnx*")))
        proto = onnx.load(str(target))  # external data read into memory: the temporary directory goes
    quantized = ir.serde.deserialize_model(proto)
    ops = Counter(node.op_type for node in ir.traversal.RecursiveGraphIterator(quantized.graph))
    int8_tables = sum(1 for v in quantized.graph.initializers.values()
                      if v.const_value is not None and v.dtype in (ir.DataType.INT8, ir.DataType.UINT8)
                      and v.name.endswith("_quantized"))
    kept_float = sum(1 for node in ir.traversal.RecursiveGraphIterator(quantized.graph)
                     if node.op_type == "MatMul" and len(node.inputs) > 1 and node.inputs[1] is not None
                     and node.inputs[1].is_initializer())
    ctx.extras["onnx_quantization"] = {
        "recipe": quantization.recipe,
        "step": _STEP,
        "format": "QOperator (DynamicQuantizeLinear + MatMulInteger; ORT fuses them into DynamicQuantizeMatMul)",
        "weights": "int8, symmetric, per output channel", "activations": "uint8, asymmetric, per tensor, at run time",
        "quantized": {"MatMul": ops.get("MatMulInteger", 0), "Gather": _gathers_of_int8(quantized)},
        "int8_tensors": int8_tables,
        "kept_float": {"MatMul with a constant weight": kept_float},
        "size_bytes": {"float_weights": weight_bytes(ctx.model), "float_onnx": float_size,
                       "quantized_onnx": quantized_size, "ratio": round(quantized_size / max(float_size, 1), 4)},
        "min_cosine": quantization.min_cosine,
    }
    quantized.metadata_props["pkg.hfexport.quantization"] = quantization.recipe
    return quantized


def _gathers_of_int8(model: ir.Model) -> int:
    """``Gather`` nodes that read an int8 table (ORT quantizes the table and dequantizes the rows it gathers)."""
    return sum(1 for node in ir.traversal.RecursiveGraphIterator(model.graph)
               if node.op_type == "Gather" and node.inputs and node.inputs[0] is not None
               and node.inputs[0].dtype in (ir.DataType.INT8, ir.DataType.UINT8))


def quantization_section(ctx: ExportContext) -> dict[str, Any]:
    """The component manifest's ``quantization`` key (empty for a float export)."""
    section = ctx.extras.get("onnx_quantization")
    return {"quantization": section} if section else {}
