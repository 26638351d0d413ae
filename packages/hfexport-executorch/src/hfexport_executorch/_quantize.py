"""``ExecutorchConfig(quantize=...)``: the quantization recipes of the XNNPACK variant, applied where they belong.

- ``"8da4w"`` — torchao's ``Int8DynamicActivationIntxWeightConfig(weight_dtype=torch.int4)``: every ``nn.Linear``
  gets int4 weights, symmetric, one scale per ``group_size`` input weights (default 32), and int8 activations,
  asymmetric, one scale per token, computed at run time. A *source transform*: stage 1 quantizes a copy of the
  model (the caller's model is never touched, and it stays the float reference of the verification), which stage 4
  then traces; XNNPACK's partitioner lowers torchao's quantize/dequantize pattern to its int4 kernels. A layer whose
  input size ``group_size`` does not divide (a 37-wide MLP) gets int8 weights per output channel instead (XNNPACK's
  int4 kernels take whole groups of a multiple of 32; the manifest lists those layers). Embeddings stay float32
  unless ``embedding=`` (below).
- ``"8da8w"`` — the same source transform with int8 weights, one scale per output channel (XNNPACK's qd8-f32-qc8w
  kernels): for layers where int4 costs too much. There is no weight-only ``"8w"`` for linear layers: XNNPACK's
  linear configs (ExecuTorch 1.5) take float, static-int8 and dynamic-int8 activations only, so torchao's
  ``IntxWeightOnlyConfig`` leaves ``torchao::dequantize_affine`` + ``linear`` undelegated, and ExecuTorch has no
  kernel for that op ("Missing out variants"; with dynamic shapes XNNPACK's ``ConvertToLinearPass`` fails first).
- ``Quantization("8da4w" | "8da8w", embedding="4w" | "8w")`` — also the ``nn.Embedding`` tables, weight-only, in
  the same source transform (torchao ``IntxWeightOnlyConfig``): ``"8w"`` int8 one scale per row, ``"4w"`` int4 one
  scale per 32 weights of a row (per row where 32 does not divide it). ``to_executorch`` fuses the pattern into
  ``quantized_decomposed::embedding_byte`` / ``embedding_4bit`` (``do_quant_fusion_and_const_prop``), which run on
  ExecuTorch's quantized kernels (``executorch.kernels.quantized``: registered before the program opens, at the
  export and by ``hfexport.load`` in a new process). A seeded tiny Llama (vocab 100, hidden 32): 8da4w 177 kB,
  with 4w embeddings 155 kB; its first 10 greedy tokens agree with float eager at 100% (8da4w alone: 60%; a
  random tiny model's near-tied logits flip easily).
- ``"int8"`` — PT2E static int8 for encoders: stage 4 traces the float model, then ``prepare_pt2e`` with
  ExecuTorch's ``XNNPACKQuantizer`` on ``aten.linear`` (``get_symmetric_quantization_config(is_per_channel=True)``:
  int8 weights per output channel, int8 activations per tensor with ranges observed on calibration inputs) composed
  with torchao's ``EmbeddingQuantizer`` (embedding tables int8, one scale per row), runs the calibration inputs (the
  export's own inputs unless ``Quantization("int8", calibration=[...])``), ``convert_pt2e``, and traces the
  converted module again (``torch.export.export``, the same dynamic shapes). ``to_executorch`` then fuses the
  embedding pattern into ``quantized_decomposed::embedding_byte`` (``do_quant_fusion_and_const_prop``), which runs
  on ExecuTorch's quantized kernels (``executorch.kernels.quantized``, registered before a quantized program is
  opened). Static per-tensor activations cost BERT-style encoders noticeably (all-MiniLM-L6-v2's sentence
  embeddings at cosine ~0.95 with float): prefer ``int8-dynamic`` for them.
- ``"int8-dynamic"`` — the same PT2E flow with ``is_dynamic=True``: activations quantized per token at run time
  (XNNPACK's ``qd8`` kernels), nothing to calibrate (one run of the export's inputs observes the weights).

The CUDA variant has no recipe (its programs are bfloat16, compiled by AOTInductor).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

import torch

from hfexport import Quantization
from hfexport.plugin import ExportContext
from hfexport.quantization import QuantizationRecipe, file_bytes, resolve_quantization, weight_bytes
from hfexport_dynamo import trace_state

from ._state import executorch_state

__all__ = ["QUANTIZATION_RECIPES", "quantization_section", "quantize_program", "quantize_source", "recipes_for",
           "register_quantized_kernels", "resolve_executorch_quantization"]

# The default thresholds of the verification (cosine of the main output with float eager), from what was measured:
# 8da4w, a tiny random Llama's logits at 0.99; int8, all-MiniLM-L6-v2's last_hidden_state at 0.89 (its pooled
# sentence embeddings at 0.95); int8-dynamic, 0.98 (0.998). A broken quantization lands far below.
QUANTIZATION_RECIPES: dict[str, dict[str, QuantizationRecipe]] = {
    "xnnpack": {
        "8da4w": QuantizationRecipe(
            "8da4w", "torchao source transform: linear layers with int4 weights in groups of group_size (symmetric) "
            "and int8 activations per token at run time", min_cosine=0.9, options=("group_size", "embedding", "symmetric"),
            default_group_size=32),
        "8da8w": QuantizationRecipe(
            "8da8w", "torchao source transform: linear layers with int8 weights per output channel (symmetric) "
            "and int8 activations per token at run time", min_cosine=0.98, options=("embedding", "symmetric")),
        "int8": QuantizationRecipe(
            "int8", "PT2E static int8 with the XNNPACK quantizer: linear layers with int8 weights per output channel "
            "and int8 activations per tensor calibrated on the export's inputs (or calibration=); embedding tables "
            "int8 per row", min_cosine=0.85, options=("calibration",)),
        "int8-dynamic": QuantizationRecipe(
            "int8-dynamic", "PT2E dynamic int8 with the XNNPACK quantizer: linear layers with int8 weights per output "
            "channel and int8 activations per token at run time; embedding tables int8 per row", min_cosine=0.95),
    },
}


# Quantization(recipe, embedding=...): nn.Embedding tables, weight-only (the recipes above keep them float).
EMBEDDING_SCHEMES = {"8w": "int8, one scale per row", "4w": "int4, one scale per 32 weights of a row"}
_EMBEDDING_GROUP = 32


def recipes_for(variant: str) -> dict[str, QuantizationRecipe]:
    """The recipes ExecuTorch variant ``variant`` supports (none for ``cuda`` and vendors' variants)."""
    return QUANTIZATION_RECIPES.get(variant, {})


def resolve_executorch_quantization(value: Any, variant: str) -> Quantization | None:
    """``ExecutorchConfig.quantize`` resolved for ``variant`` (:func:`hfexport.quantization.resolve_quantization`).

    Raises:
        ValueError: a recipe the variant does not support (naming those it does), an option the recipe does not
            take, or an 8da4w ``group_size`` that is not a multiple of 32 (XNNPACK's int4 kernels take no other).
    """
    quantization = resolve_quantization(value, recipes_for(variant), f"backend 'executorch-{variant}'")
    if quantization is not None and quantization.recipe == "8da4w" and quantization.group_size % 32:
        raise ValueError(f"8da4w group_size must be a multiple of 32 (XNNPACK's blockwise int4 kernels take no "
                         f"other), got {quantization.group_size}")
    if quantization is not None and quantization.symmetric is False:
        raise ValueError(f"{quantization.recipe} quantizes weights symmetrically only (XNNPACK's int4/int8 weight "
                         "kernels take no zero point): drop symmetric=False (--sym is its default)")
    if quantization is not None and quantization.embedding not in (None, *EMBEDDING_SCHEMES):
        raise ValueError(f"embedding={quantization.embedding!r} is not an embedding scheme: "
                         f"{', '.join(f'{k!r} ({v})' for k, v in EMBEDDING_SCHEMES.items())}")
    return quantization


def register_quantized_kernels() -> None:
    """Register ExecuTorch's quantized kernels (``quantized_decomposed::*``, e.g. ``embedding_byte``) with the
    runtime and torch: a quantized program's methods fail to load without them (``OperatorMissing``)."""
    import executorch.kernels.quantized  # noqa: F401 - loads libquantized_ops_aot_lib, which registers them


def _linear_layers(model: torch.nn.Module) -> list[tuple[str, torch.nn.Linear]]:
    return [(name, m) for name, m in model.named_modules() if isinstance(m, torch.nn.Linear)]


def quantize_source(ctx: ExportContext) -> None:
    """Stage 1, after the variant's preparation: for a source-transform recipe (``8da4w``, ``8da8w``, and
    ``embedding=``), quantize a copy of the model and trace that copy (``ctx.model`` is the copy until the stages
    end, then the float model again)."""
    quantization: Quantization | None = ctx.config.quantize  # type: ignore[attr-defined]
    if quantization is None or quantization.recipe not in ("8da4w", "8da8w"):
        return
    from torchao.quantization import (
        Int8DynamicActivationIntxWeightConfig,
        IntxWeightOnlyConfig,
        PerAxis,
        PerGroup,
        quantize_,
    )

    group = int(quantization.group_size or 32)
    with ctx.step("torchao.quantization.quantize_"):
        quantized = copy.deepcopy(ctx.model)
        layers = _linear_layers(quantized)
        if quantization.recipe == "8da4w":
            grouped = {name for name, m in layers if m.in_features % group == 0}
            per_channel = sorted({n for n, _ in layers} - grouped)
            for names, bits, granularity in ((grouped, torch.int4, PerGroup(group)),
                                             (set(per_channel), torch.int8, PerAxis(0))):
                if names:
                    config = Int8DynamicActivationIntxWeightConfig(weight_dtype=bits, weight_granularity=granularity)
                    quantize_(quantized, config, filter_fn=lambda m, fqn, names=names: fqn in names)
        elif layers:
            quantize_(quantized, Int8DynamicActivationIntxWeightConfig(weight_dtype=torch.int8,
                                                                       weight_granularity=PerAxis(0)),
                      filter_fn=lambda m, fqn: isinstance(m, torch.nn.Linear))
        embeddings = [(n, m) for n, m in quantized.named_modules() if isinstance(m, torch.nn.Embedding)]
        per_row_tables = []
        if quantization.embedding and embeddings:
            bits = torch.int8 if quantization.embedding == "8w" else torch.int4
            for name, module in embeddings:
                # padding_idx only masks the gradient; in the trace it stays an argument of aten.embedding, and
                # ExecuTorch's QuantFusionPass matches embedding(dequantize_affine(...), indices) without one: the
                # table would stay torchao::dequantize_affine, which has no ExecuTorch kernel ("Missing out
                # variants"). Upstream: executorch exir/passes/_quant_patterns_and_replacements.py (torchao embedding
                # patterns, 1.5). Remove when its patterns take padding_idx.
                module.padding_idx = None
                grouped_rows = bits == torch.int4 and module.embedding_dim % _EMBEDDING_GROUP == 0
                if bits == torch.int4 and not grouped_rows:
                    per_row_tables.append(name)
                config = IntxWeightOnlyConfig(weight_dtype=bits, granularity=PerGroup(_EMBEDDING_GROUP)
                                              if grouped_rows else PerAxis(0))
                quantize_(quantized, config, filter_fn=lambda m, fqn, name=name: fqn == name)
    if quantization.embedding and embeddings:
        # to_executorch fuses torchao's dequantize_affine + embedding into quantized_decomposed::embedding_byte /
        # embedding_4bit (ExecuTorch's QuantFusionPass), which run on its quantized kernels
        executorch_state(ctx).preparation.backend_config_options.setdefault("do_quant_fusion_and_const_prop", True)
        register_quantized_kernels()  # the runner opens the program at the end of stage 5
    linear_weights = (f"int4, symmetric, groups of {group} input weights (int8 per output channel where {group} "
                      "does not divide the input size: XNNPACK's int4 kernels need whole groups of 32)"
                      if quantization.recipe == "8da4w" else "int8, symmetric, per output channel")
    embedding_weights = (f"{quantization.embedding}: {EMBEDDING_SCHEMES[quantization.embedding]}"
                         + (f" (per row where {_EMBEDDING_GROUP} does not divide the row)" if per_row_tables else "")
                         if quantization.embedding else "float32")
    executorch_state(ctx).quantization = {
        "recipe": quantization.recipe, "step": "torchao.quantization.quantize_ (before the trace)",
        "weights": f"linear: {linear_weights}; embedding: {embedding_weights}",
        "activations": "int8, asymmetric, per token, at run time",
        **({"group_size": group, "int8_per_channel_layers": per_channel} if quantization.recipe == "8da4w" else {}),
        **({"embedding": quantization.embedding, "int4_per_row_tables": per_row_tables}
           if quantization.embedding else {}),
        "quantized": {"linear": len(layers), "embedding": len(embeddings) if quantization.embedding else 0},
        "kept_float": {"embedding": 0 if quantization.embedding else len(embeddings)},
        "float_weights_bytes": weight_bytes(ctx.model), "min_cosine": quantization.min_cosine,
    }
    if quantization.recipe == "8da4w" and per_channel:
        ctx.note(f"8da4w: {len(per_channel)} linear layers get int8 weights per output channel (group_size={group} "
                 f"does not divide their input size): {', '.join(per_channel[:5])}{' ...' if len(per_channel) > 5 else ''}")
    float_model = ctx.model
    ctx.stack.callback(setattr, ctx, "model", float_model)  # the float model again once the stages end
    ctx.model = quantized


def _calibration_args(ctx: ExportContext, quantization: Quantization) -> list[tuple[Any, ...]]:
    """The calibration batches as positional arguments of the traced program (the export's inputs by default),
    floating tensors in the export's dtype, every tensor contiguous."""
    batches: list[Mapping[str, Any]] = list(quantization.calibration or [ctx.inputs])
    dtype = next((v.dtype for v in ctx.inputs.values() if isinstance(v, torch.Tensor) and v.is_floating_point()),
                 torch.float32)

    def placed(value: Any, like: Any) -> Any:
        if not isinstance(value, torch.Tensor):
            return value
        value = value.to(like.device if isinstance(like, torch.Tensor) else "cpu")
        return (value.to(dtype) if value.is_floating_point() else value).contiguous()

    return [tuple(placed(batch[name], like) for name, like in ctx.inputs.items()) for batch in batches]


def quantize_program(ctx: ExportContext) -> None:
    """Stage 4, after the trace: for a PT2E recipe (``int8``), prepare, calibrate and convert ``ctx.program``'s
    module, and trace the converted module again (same inputs, same dynamic shapes) into ``ctx.program``."""
    quantization: Quantization | None = ctx.config.quantize  # type: ignore[attr-defined]
    if quantization is None or quantization.recipe not in ("int8", "int8-dynamic"):
        return
    dynamic = quantization.recipe == "int8-dynamic"
    from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (
        XNNPACKQuantizer,
        get_symmetric_quantization_config,
    )
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e
    from torchao.quantization.pt2e.quantizer import ComposableQuantizer
    from torchao.quantization.pt2e.quantizer.embedding_quantizer import EmbeddingQuantizer

    batches = _calibration_args(ctx, quantization)
    register_quantized_kernels()  # the runner opens the program at the end of stage 5
    # to_executorch fuses the embedding tables' dequantize + embedding into quantized_decomposed::embedding_byte
    executorch_state(ctx).preparation.backend_config_options.setdefault("do_quant_fusion_and_const_prop", True)
    # Linear layers only: quantizing XNNPACK's other patterns too (add, mul, cat: the residual stream) costs
    # all-MiniLM-L6-v2 most of its accuracy (sentence embeddings at cosine 0.85 with float, against 0.95).
    config = get_symmetric_quantization_config(is_per_channel=True, is_dynamic=dynamic)
    quantizer = ComposableQuantizer([
        EmbeddingQuantizer(), XNNPACKQuantizer().set_operator_type(torch.ops.aten.linear.default, config)])
    float_program = ctx.program
    ctx.install_patches(("executorch.quantization",))  # _patch_xnnpack_quantizer_integer_scalars
    with ctx.step("prepare_pt2e, calibration, convert_pt2e"):
        prepared = prepare_pt2e(float_program.module(), quantizer)
        with torch.no_grad():
            for args in batches:
                prepared(*args)
        converted = convert_pt2e(prepared)
    with ctx.step("torch.export.export (quantized)"):
        ctx.program = torch.export.export(converted, tuple(ctx.inputs.values()),
                                          dynamic_shapes=trace_state(ctx).dynamic_shapes, strict=False)
    targets = [str(n.target) for n in ctx.program.graph.nodes if n.op == "call_function"]
    linear = sum(1 for n in float_program.graph.nodes if n.op == "call_function" and n.target in (
        torch.ops.aten.linear.default, torch.ops.aten.addmm.default, torch.ops.aten.mm.default))
    embedding = sum(1 for n in float_program.graph.nodes
                    if n.op == "call_function" and n.target is torch.ops.aten.embedding.default)
    executorch_state(ctx).quantization = {
        "recipe": quantization.recipe, "step": "prepare_pt2e, calibration, convert_pt2e (after the trace)",
        "quantizer": f"XNNPACKQuantizer (aten.linear: get_symmetric_quantization_config(is_per_channel=True, "
                     f"is_dynamic={dynamic})) + EmbeddingQuantizer",
        "weights": "int8, symmetric, per output channel; embedding tables int8 per row",
        "activations": "int8, asymmetric, per token, at run time" if dynamic else
                       "int8, per tensor, ranges observed on the calibration inputs",
        **({} if dynamic else {"calibration": {"batches": len(batches), "source": "calibration="
                                               if quantization.calibration else "the export's inputs"}}),
        "quantized": {"linear": linear, "embedding": embedding,
                      "quantize_ops": sum("quantize_per" in t and "dequantize" not in t for t in targets)},
        "float_weights_bytes": weight_bytes(ctx.model), "min_cosine": quantization.min_cosine,
    }


def quantization_section(section: dict[str, Any] | None, runner: Any) -> dict[str, Any]:
    """The component manifest's ``quantization`` key (empty for a float export), with the size of ``runner``'s
    program."""
    if not section:
        return {}
    section = dict(section)
    size = file_bytes([getattr(runner, "path", None), getattr(runner, "data_path", None)])
    float_bytes = section.pop("float_weights_bytes")
    section["size_bytes"] = {"float_weights": float_bytes, "quantized_program": size,
                             "ratio_to_float_weights": round(size / max(float_bytes, 1), 4)}
    return {"quantization": section}
