"""Quantized exports: the ``quantize=`` option every backend that quantizes shares, its checks before any work, and
the comparison a quantized artifact is verified with.

A backend declares its recipes (a mapping name -> :class:`QuantizationRecipe`) and applies them at the stage where
they belong (ONNX: ONNX Runtime's dynamic int8 after the optimizer; ExecuTorch: torchao's 8da4w as a source
transform before the trace, PT2E static int8 after it). The kernel knows no recipe: it holds

- :class:`Quantization`, the option's value (``quantize="8da4w"`` is ``Quantization("8da4w")``) with its options;
- :func:`resolve_quantization`, which refuses a recipe the backend does not support (naming those it does) and
  options the recipe does not take;
- :func:`check_quantization_inputs`, run before the first stage: a model that is quantized already, and a
  calibration set whose inputs do not match the export's, are refused before any work;
- :func:`compare_quantized`, the verification of a quantized artifact (its manifest records a ``quantization``
  section; :meth:`hfexport.ExportedModel.verify` and ``verify_stored`` use it then).

**How a quantized artifact is verified.** It is compared with the *float* eager model, where elementwise
tolerances (``atol``/``rtol``) do not fit: quantization moves every value a little. For every floating output the
report gives the max abs diff and the cosine similarity with eager (both tensors flattened, in float64); for an
output named ``logits`` also the top-1 agreement (argmax over the last dim, the fraction of positions that agree:
the label of a classifier, the next token of an LM). The export passes when the cosine similarity of the *main*
output (the first floating output: ``logits``, ``last_hidden_state``) is at least ``min_cosine``; the other
outputs are reported, not gated. Each recipe has a default ``min_cosine`` (its backend's recipe table, recorded in
the manifest's ``quantization`` section); ``Quantization(recipe, min_cosine=...)`` overrides it.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ._comparison import (
    COMPARISONS,
    DEFAULT_COMPONENT,
    OutputDiff,
    VerificationReport,
    _json_float,
    flatten_with_names,
)
from ._context import InvalidInputError

__all__ = ["Quantization", "QuantizationRecipe", "QuantizedOutputDiff", "QuantizedVerificationReport",
           "check_quantization_inputs", "compare_quantized", "file_bytes", "quantized_model_reason",
           "resolve_quantization", "weight_bytes"]


@dataclass(frozen=True)
class QuantizationRecipe:
    """What a backend offers under one recipe name.

    Attributes:
        name: the recipe name users pass (``"int8-dynamic"``, ``"8da4w"``, ``"int8"``).
        summary: one line: what is quantized, to what, how.
        min_cosine: the default threshold of the verification (cosine similarity of the main output with float
            eager).
        options: the :class:`Quantization` options the recipe takes (``"group_size"``, ``"calibration"``,
            ``"embedding"``, ``"symmetric"``, ``"ratio"``).
        default_group_size: for recipes that take ``group_size``.
    """

    name: str
    summary: str
    min_cosine: float
    options: tuple[str, ...] = ()
    default_group_size: int | None = None


@dataclass(frozen=True, repr=False)
class Quantization:
    """The ``quantize=`` option: a recipe name and its options (``quantize="8da4w"`` is ``Quantization("8da4w")``).

    Attributes:
        recipe: a recipe of the backend (``hfexport stages BACKEND`` and the backend's docs list them).
        group_size: weights per scale of grouped recipes (``8da4w``: default 32). A layer whose input size it does
            not divide is quantized per output channel instead (the manifest lists those layers).
        calibration: input mappings (forward keyword arguments, like the export's inputs) that static recipes
            (``int8``) observe activation ranges on; default: the export's own inputs (the user's, or the dummy
            inputs built from the config). Each must name the export's tensor inputs with their dtypes and ranks.
        min_cosine: the verification threshold (cosine similarity of the main output with float eager, in
            ``(0, 1]``); default: the recipe's.
        embedding: also quantize the ``nn.Embedding`` tables, weight-only, for recipes that take it (ExecuTorch's
            ``8da4w`` and ``8w``): ``"8w"`` (int8, one scale per row) or ``"4w"`` (int4, one scale per 32 weights
            of a row); default: the recipe's (those two keep embeddings float).
        symmetric: for recipes that take it, symmetric weights (one scale, no zero point: ONNX's ``MatMulNBits``
            ``is_symmetric``, NNCF's ``INT4_SYM``/``INT8_SYM``) or asymmetric (a zero point per group); default: the
            recipe's (ONNX symmetric, OpenVINO asymmetric; ExecuTorch's 8da4w/8da8w are symmetric only).
        ratio: for recipes that take it (OpenVINO ``int4-weights``), the share of the weights in int4, in ``(0, 1]``
            (the others int8); default: the backend's.
    """

    recipe: str
    group_size: int | None = None
    calibration: Sequence[Mapping[str, Any]] | None = None
    min_cosine: float | None = None
    embedding: str | None = None
    symmetric: bool | None = None
    ratio: float | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.recipe, str) or not self.recipe:
            raise TypeError(f"a quantization recipe is a name such as '8da4w', got {self.recipe!r}")
        if self.group_size is not None and (isinstance(self.group_size, bool) or not isinstance(self.group_size, int)
                                            or self.group_size < 1):
            raise TypeError(f"group_size must be a positive int (weights per scale), got {self.group_size!r}")
        if self.calibration is not None:
            if isinstance(self.calibration, Mapping) or not isinstance(self.calibration, Sequence) \
                    or not self.calibration or not all(isinstance(b, Mapping) for b in self.calibration):
                raise TypeError("calibration must be a non-empty list of input mappings (forward keyword arguments, "
                                f"e.g. [{{'input_ids': ..., 'attention_mask': ...}}, ...]), got "
                                f"{type(self.calibration).__name__}")
            object.__setattr__(self, "calibration", tuple(self.calibration))
        if self.min_cosine is not None and (isinstance(self.min_cosine, bool)
                                            or not isinstance(self.min_cosine, int | float)
                                            or not 0 < self.min_cosine <= 1):
            raise TypeError(f"min_cosine must be a number in (0, 1] (the verification's cosine threshold), got "
                            f"{self.min_cosine!r}")
        if self.embedding is not None and not isinstance(self.embedding, str):
            raise TypeError(f"embedding must be a scheme name such as '4w' or '8w', got {self.embedding!r}")
        if self.symmetric is not None and not isinstance(self.symmetric, bool):
            raise TypeError(f"symmetric must be True, False or None (the recipe's default), got {self.symmetric!r}")
        if self.ratio is not None and (isinstance(self.ratio, bool) or not isinstance(self.ratio, int | float)
                                       or not 0 < self.ratio <= 1):
            raise TypeError(f"ratio must be a number in (0, 1] (the share of the weights in the recipe's low "
                            f"precision), got {self.ratio!r}")

    def __repr__(self) -> str:  # the manifest's config records it: never the calibration tensors themselves
        parts = [repr(self.recipe)]
        if self.group_size is not None:
            parts.append(f"group_size={self.group_size}")
        if self.calibration is not None:
            parts.append(f"calibration=<{len(self.calibration)} batches>")
        if self.min_cosine is not None:
            parts.append(f"min_cosine={self.min_cosine}")
        if self.embedding is not None:
            parts.append(f"embedding={self.embedding!r}")
        if self.symmetric is not None:
            parts.append(f"symmetric={self.symmetric}")
        if self.ratio is not None:
            parts.append(f"ratio={self.ratio}")
        return f"Quantization({', '.join(parts)})"


def resolve_quantization(value: Any, recipes: Mapping[str, QuantizationRecipe],
                         where: str) -> Quantization | None:
    """``quantize=`` as a :class:`Quantization` with the recipe's defaults filled in (``None`` stays ``None``).

    Args:
        value: ``None``, a recipe name, or a :class:`Quantization`.
        recipes: the recipes the backend supports.
        where: the backend as the message names it (``"backend 'onnx'"``).

    Raises:
        TypeError: ``value`` is neither.
        ValueError: a recipe ``where`` does not support (the message names those it does), or an option the recipe
            does not take.
    """
    if value is None:
        return None
    if isinstance(value, str):
        value = Quantization(value)
    if not isinstance(value, Quantization):
        raise TypeError(f"quantize must be a recipe name (e.g. {next(iter(recipes), '8da4w')!r}) or a "
                        f"hfexport.Quantization, got {type(value).__name__}")
    recipe = recipes.get(value.recipe)
    if recipe is None:
        offered = (f"it supports {', '.join(map(repr, recipes))}" if recipes else
                   "it supports no quantization recipe")
        raise ValueError(f"{where} does not support quantize={value.recipe!r}: {offered}")
    given = [name for name in ("group_size", "calibration", "embedding", "symmetric", "ratio")
             if getattr(value, name) is not None]
    extra = [name for name in given if name not in recipe.options]
    if extra:
        takes = f"it takes {', '.join(recipe.options)}" if recipe.options else "it takes no options"
        raise ValueError(f"quantize recipe {recipe.name!r} ({recipe.summary}) takes no {', '.join(extra)}; {takes}")
    if "group_size" in recipe.options and value.group_size is None:
        value = dataclasses.replace(value, group_size=recipe.default_group_size)
    if value.min_cosine is None:
        value = dataclasses.replace(value, min_cosine=recipe.min_cosine)
    return value


def quantized_model_reason(model: Any) -> str | None:
    """Why ``model`` is quantized already (``None`` when it is not): torchao tensor subclasses or integer weights,
    ``torch.ao`` quantized modules, or a Transformers model loaded with a ``quantization_config``."""
    import torch

    qconfig = getattr(getattr(model, "config", None), "quantization_config", None)
    if getattr(model, "is_quantized", False) or qconfig:
        method = qconfig.get("quant_method") if isinstance(qconfig, dict) else getattr(qconfig, "quant_method", None)
        return f"it was loaded with a quantization_config (quant_method {method or '?'})"
    for name, module in model.named_modules():
        kind = type(module).__module__
        if kind.startswith(("torch.ao.nn.quantized", "torch.nn.quantized", "torchao.")):
            return f"{name or 'the model'} is a {type(module).__qualname__} ({kind})"
        for pname, tensor in list(module._parameters.items()) + list(module._buffers.items()):
            if tensor is None:
                continue
            data = tensor.data if isinstance(tensor, torch.nn.Parameter) else tensor
            qualified = f"{name}.{pname}" if name else pname
            if type(data).__module__.startswith("torchao"):
                return f"{qualified} is a {type(data).__name__} (a torchao quantized tensor)"
            if data.is_quantized or (data.dtype in (torch.int8, torch.uint8) and isinstance(tensor, torch.nn.Parameter)):
                return f"{qualified} holds {str(data.dtype).replace('torch.', '')} weights"
    return None


def check_quantization_inputs(quantization: Quantization | None, inputs: Mapping[str, Any], model: Any, *,
                              static_shapes: bool, backend: str) -> None:
    """Refuse, before the first stage, a model that is quantized already and a calibration set that does not fit.

    Args:
        quantization: the resolved option (nothing is checked for ``None``).
        inputs: the export's inputs (forward keyword arguments).
        model: the model to export.
        static_shapes: the export fixes every shape (no dynamic dims): calibration inputs must have the traced
            shapes, since the traced program takes no other.
        backend: the backend's name, for the messages.

    Raises:
        InvalidInputError: says what is wrong and what to pass instead.
    """
    import torch

    if quantization is None:
        return
    reason = quantized_model_reason(model)
    if reason is not None:
        raise InvalidInputError(f"{type(model).__name__} is quantized already ({reason}); quantize={quantization.recipe!r} "
                                "quantizes a float model: export the float checkpoint with quantize=..., or this "
                                "model without quantize")
    if quantization.calibration is None:
        return
    expected = {k: v for k, v in inputs.items() if isinstance(v, torch.Tensor)}
    for i, batch in enumerate(quantization.calibration):
        given = {k: v for k, v in batch.items() if isinstance(v, torch.Tensor)}
        where = f"calibration batch {i}"
        missing, unknown = sorted(set(expected) - set(given)), sorted(set(batch) - set(inputs))
        if missing or unknown:
            parts = ([f"lacks {', '.join(missing)}"] if missing else []) + \
                    ([f"has {', '.join(unknown)}, which the export does not take"] if unknown else [])
            raise InvalidInputError(f"{where} {' and '.join(parts)}: every batch must name the export's tensor inputs "
                                    f"({', '.join(expected)}), as forward keyword arguments")
        for name, ref in expected.items():
            value = given[name]
            if value.dtype != ref.dtype or value.dim() != ref.dim():
                raise InvalidInputError(
                    f"{where}: input {name!r} is {str(value.dtype).replace('torch.', '')} of rank {value.dim()} "
                    f"(shape {list(value.shape)}); the export takes {str(ref.dtype).replace('torch.', '')} of rank "
                    f"{ref.dim()} (traced shape {list(ref.shape)})")
            if static_shapes and value.shape != ref.shape:
                raise InvalidInputError(
                    f"{where}: input {name!r} has shape {list(value.shape)}, but this {backend} export has static "
                    f"shapes (traced {list(ref.shape)}) and its program takes no other: pad the calibration "
                    "inputs to the traced shapes, or export with dynamic=True")


def weight_bytes(model: Any) -> int:
    """Bytes of the model's parameters and buffers (each tensor once, also when tied)."""
    seen, total = set(), 0
    for tensor in list(model.parameters()) + list(model.buffers()):
        if id(tensor) not in seen:
            seen.add(id(tensor))
            total += tensor.numel() * tensor.element_size()
    return total


def file_bytes(paths: Sequence[Any]) -> int:
    """The total size of ``paths`` that exist, in bytes."""
    from pathlib import Path

    return sum(Path(p).stat().st_size for p in paths if p is not None and Path(p).is_file())


# ── verification ──────────────────────────────────────────────────────────────────────────────────────────
@dataclass
class QuantizedOutputDiff(OutputDiff):
    """One output of a quantized artifact against float eager: max abs diff, cosine similarity, top-1 agreement.

    Attributes:
        cosine: cosine similarity of the flattened tensors (float64; 1.0 when both are all zero). ``None`` for
            integer outputs.
        top1_agreement: for ``logits`` outputs, the fraction of positions whose argmax over the last dim agrees.
        agreement: for integer and boolean outputs, the fraction of equal elements.
        gates: whether this output decides ``passed`` (the main output).
    """

    cosine: float | None = None
    top1_agreement: float | None = None
    agreement: float | None = None
    gates: bool = False

    def as_dict(self) -> dict[str, Any]:
        out = super().as_dict()
        out.pop("tolerance", None)
        out.pop("max_rel_diff", None)
        for key in ("cosine", "top1_agreement", "agreement"):
            value = getattr(self, key)
            if value is not None:
                out[key] = _json_float(value)
        out["gates"] = self.gates
        return out


@dataclass
class QuantizedVerificationReport(VerificationReport):
    """The verification of a quantized artifact against the float eager model (see the module docstring).

    ``passed``: the main output's cosine similarity is at least ``min_cosine`` (and every output has eager's
    shape). ``atol`` and ``rtol`` are recorded as given; they decide nothing here.
    """

    recipe: str = ""
    min_cosine: float = 0.99
    main_output: str | None = None
    outputs: list[QuantizedOutputDiff] = field(default_factory=list)  # type: ignore[assignment]

    @property
    def cosine(self) -> float | None:
        """The main output's cosine similarity with float eager."""
        main = next((o for o in self.outputs if o.gates), None)
        return main.cosine if main is not None else None

    @property
    def top1_agreement(self) -> float | None:
        """The main output's top-1 agreement (``logits`` outputs), else the first ``logits`` output's."""
        values = [o.top1_agreement for o in sorted(self.outputs, key=lambda o: not o.gates)
                  if o.top1_agreement is not None]
        return values[0] if values else None

    def as_dict(self) -> dict[str, Any]:
        out = super().as_dict()
        out.update(metric="quantized", recipe=self.recipe, min_cosine=self.min_cosine, main_output=self.main_output,
                   cosine=None if self.cosine is None else _json_float(self.cosine),
                   top1_agreement=None if self.top1_agreement is None else _json_float(self.top1_agreement),
                   rule="a quantized artifact against float eager: passes when the cosine similarity of the main "
                        "output (the first floating output; both flattened) is >= min_cosine; every output's max "
                        "abs diff and cosine, and top-1 agreement of logits outputs, are reported")
        return out

    def __str__(self) -> str:
        lines = [f"verification of a {self.recipe} quantized export on {self.backend} against float eager "
                 f"(main output {self.main_output}: cosine >= {self.min_cosine:g}): "
                 f"{'PASSED' if self.passed else 'FAILED'}"]
        for o in self.outputs:
            extra = "".join(f"  {label} {value:.4f}" for label, value in
                            (("cosine", o.cosine), ("top-1", o.top1_agreement), ("equal", o.agreement))
                            if value is not None)
            lines.append(f"  {'✅' if o.ok else '❌'} {o.name:<28} {str(list(o.shape)):<18} {o.dtype:<10} "
                         f"max abs diff {o.max_abs_diff:.3e}{extra}{'  (gates)' if o.gates else ''}"
                         + (f"  ({o.note})" if o.note else ""))
        return "\n".join(lines)

    def failure_message(self, backend: str, model_class: str, component: str = DEFAULT_COMPONENT) -> str:
        """The text of the :class:`hfexport.VerificationError` a failed quantized export raises."""
        shapes = ", ".join(f"{k}={v}" for k, v in self.inputs.items())
        where = f", component {component!r}" if component != DEFAULT_COMPONENT else ""
        lines = [f"{backend} export of {model_class} quantized with {self.recipe!r} failed verification against "
                 f"float eager{' at ' + shapes if shapes else ''}{where}:"]
        for o in self.outputs:
            if not o.ok:
                cosine = f"cosine {o.cosine:.4f} where the threshold is {self.min_cosine:g}" \
                    if o.cosine is not None else f"max abs diff {o.max_abs_diff:.3e}"
                lines.append(f"  - {o.name} {list(o.shape)} {o.dtype}: {cosine}" + (f" ({o.note})" if o.note else ""))
        lines.append("Pass verify=False to keep the artifact anyway (its manifest records the report, passed: false), "
                     "or Quantization(recipe, min_cosine=...) to change the threshold; a recipe that quantizes less "
                     "(int8 rather than 8da4w) costs less accuracy")
        return "\n".join(lines)


def _cosine(e: Any, a: Any) -> float:
    import torch

    e, a = e.detach().double().flatten(), a.detach().double().flatten()
    ne, na = torch.linalg.vector_norm(e), torch.linalg.vector_norm(a)
    if ne == 0 and na == 0:
        return 1.0
    if ne == 0 or na == 0:
        return 0.0
    return float(torch.dot(e, a) / (ne * na))


def compare_quantized(backend: str, expected: Any, actual: Any, quantization: Mapping[str, Any], *,
                      atol: float = 0.0, rtol: float = 0.0) -> QuantizedVerificationReport:
    """Compare a quantized artifact's outputs with the float eager outputs, leaf by leaf (see the module docstring).

    Args:
        quantization: the manifest's ``quantization`` section (``recipe``, ``min_cosine``).
        atol, rtol: recorded in the report (they decide nothing for a quantized artifact).

    Raises:
        ValueError: the output structures differ (names the leaves on each side).
    """
    import torch

    names, exp_leaves, _ = flatten_with_names(expected)
    act_names, act_leaves, _ = flatten_with_names(actual)
    if len(exp_leaves) != len(act_leaves):
        raise ValueError(f"exported outputs {act_names} do not match eager outputs {names}")
    min_cosine = float(quantization.get("min_cosine") or 0.99)
    report = QuantizedVerificationReport(backend, atol, rtol, recipe=str(quantization.get("recipe", "?")),
                                         min_cosine=min_cosine)
    for name, e, a in zip(names, exp_leaves, act_leaves, strict=True):
        if not isinstance(e, torch.Tensor):
            report.outputs.append(QuantizedOutputDiff(name, (), type(e).__name__, 0.0 if e == a else math.inf,
                                                      e == a))
            continue
        a = torch.as_tensor(a).to(e.device)
        dtype = str(e.dtype).replace("torch.", "")
        if a.shape != e.shape:
            report.outputs.append(QuantizedOutputDiff(name, tuple(a.shape), dtype, math.inf, False,
                                                      note=f"shape {list(a.shape)} where eager has {list(e.shape)}"))
            continue
        floating = e.is_floating_point() or e.is_complex()
        diff = float((a.double() - e.double()).abs().max()) if e.numel() else 0.0
        out = QuantizedOutputDiff(name, tuple(e.shape), dtype, diff, True)
        if floating:
            finite = bool(torch.isfinite(a).all()) or not bool(torch.isfinite(e).all())
            out.cosine = _cosine(e, a) if finite else float("nan")
            if not finite:
                out.note = "NaN or Inf in the export where eager has none"
            if name.split(".")[-1].endswith("logits") and e.dim() >= 1 and e.shape[-1] > 1 and e.numel():
                out.top1_agreement = float((a.argmax(-1) == e.argmax(-1)).double().mean())
            if report.main_output is None:
                report.main_output, out.gates = name, True
                out.ok = not math.isnan(out.cosine) and out.cosine >= min_cosine
        else:
            out.agreement = float((a == e).double().mean()) if e.numel() else 1.0
        report.outputs.append(out)
    return report


COMPARISONS["quantization"] = compare_quantized  # artifacts whose manifest has a quantization section
