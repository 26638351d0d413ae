"""Comparing an artifact's outputs with eager PyTorch: :func:`compare_outputs`, its :class:`VerificationReport` of
:class:`OutputDiff` s, and the :class:`VerificationError` an export raises on a mismatch."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ._stages import ExportError

__all__ = ["DEFAULT_COMPONENT", "OutputDiff", "VerificationError", "VerificationReport", "compare_outputs",
           "flatten_with_names"]

DEFAULT_COMPONENT = "model"  # the component ``ExportedModel.__call__`` runs


def _path_name(path: tuple[Any, ...]) -> str:
    parts = []
    for key in path:
        for attr in ("key", "idx", "name"):
            if hasattr(key, attr):
                parts.append(str(getattr(key, attr)))
                break
        else:
            parts.append(str(key))
    return ".".join(parts) or "output"


def flatten_with_names(tree: Any) -> tuple[list[str], list[Any], Any]:
    """``(names, leaves, treespec)`` of a pytree; names are dotted key paths (``"last_hidden_state"``)."""
    import torch.utils._pytree as pytree

    pairs, spec = pytree.tree_flatten_with_path(tree)
    return [_path_name(p) for p, _ in pairs], [leaf for _, leaf in pairs], spec


@dataclass
class OutputDiff:
    """Comparison of one output tensor against eager PyTorch.

    A NaN or Inf of the export where eager has none (or the reverse) makes ``max_abs_diff`` NaN or Inf (never
    0.0), fails the output and is counted in ``note``; NaN and Inf at the same places on both sides are equal.

    Attributes:
        max_rel_diff: the largest ``|exported - eager| / |eager|`` over the elements where ``|eager| > atol`` (below
            it the absolute tolerance decides); 0.0 where there is none.
        tolerance: the largest difference the tolerances allowed for this output (``atol + rtol * max|eager|``).
        note: what else failed (non-finite values on one side only).
    """

    name: str
    shape: tuple[int, ...]
    dtype: str
    max_abs_diff: float
    ok: bool
    max_rel_diff: float = 0.0
    tolerance: float = 0.0
    note: str = ""

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready: NaN and Inf become the strings ``"nan"``, ``"inf"``, ``"-inf"``."""
        return {"name": self.name, "shape": list(self.shape), "dtype": self.dtype, "ok": self.ok,
                "max_abs_diff": _json_float(self.max_abs_diff), "max_rel_diff": _json_float(self.max_rel_diff),
                "tolerance": _json_float(self.tolerance), **({"note": self.note} if self.note else {})}


def _json_float(value: float) -> float | str:
    value = float(value)
    return value if math.isfinite(value) else str(value)


@dataclass
class VerificationReport:
    """Max abs difference of every output against eager, with the tolerances used.

    ``passed`` is True when every output satisfies ``|exported - eager| <= atol + rtol * |eager|``
    (integer and boolean outputs must be equal).

    Attributes:
        inputs: input name -> shape (a list of shapes for a pytree input) the comparison ran at.
        diagnosis: where a failing export goes wrong, when the backend could find it
            (:meth:`Exporter.diagnose_mismatch`: ExecuTorch names the delegated partition and op); ``summary`` is
            its one-line text.
    """

    backend: str
    atol: float
    rtol: float
    outputs: list[OutputDiff] = field(default_factory=list)
    inputs: dict[str, Any] = field(default_factory=dict)
    diagnosis: dict[str, Any] | None = None

    @property
    def passed(self) -> bool:
        return bool(self.outputs) and all(o.ok for o in self.outputs)

    @property
    def max_abs_diff(self) -> float:
        diffs = [o.max_abs_diff for o in self.outputs]
        if any(math.isnan(d) for d in diffs):
            return float("nan")
        return max(diffs, default=float("nan"))

    def as_dict(self) -> dict[str, Any]:
        """The report as stored in the manifest (``manifest["verification"]``)."""
        return {"backend": self.backend, "passed": self.passed, "atol": self.atol, "rtol": self.rtol,
                "rule": "|exported - eager| <= atol + rtol * |eager| elementwise; integer and boolean outputs "
                        "equal; NaN/Inf only where eager has the same; max_rel_diff over the elements where "
                        "|eager| > atol",
                "max_abs_diff": _json_float(self.max_abs_diff), "inputs": self.inputs,
                "outputs": [o.as_dict() for o in self.outputs],
                **({"diagnosis": self.diagnosis} if self.diagnosis else {})}

    def __getitem__(self, name: str) -> OutputDiff:
        for o in self.outputs:
            if o.name == name:
                return o
        raise KeyError(f"no output {name!r}; outputs: {[o.name for o in self.outputs]}")

    def __str__(self) -> str:
        lines = [f"verification on {self.backend} (atol={self.atol:g}, rtol={self.rtol:g}): "
                 f"{'PASSED' if self.passed else 'FAILED'}",
                 "  ✅: |exported - eager| <= atol + rtol * |eager| at every element; 'rel': the largest "
                 "|exported - eager| / |eager| where |eager| > atol"]
        for o in self.outputs:
            lines.append(f"  {'✅' if o.ok else '❌'} {o.name:<28} {str(list(o.shape)):<18} {o.dtype:<10} "
                         f"max abs diff {o.max_abs_diff:.3e}  rel {o.max_rel_diff:.3e}"
                         + (f"  ({o.note})" if o.note else ""))
        return "\n".join(lines)


class VerificationError(ExportError):
    """An export ran to the end, but its artifact's outputs differ from eager PyTorch beyond the tolerances.

    Raised by :func:`hfexport.export` (``Exporter.export``) after packaging: the artifact ran on its runtime, and
    the model in eager PyTorch, on the traced inputs. The message lists every failing output with its max abs
    difference (NaN or Inf as such) and the tolerance it had, and says how to opt out.

    A subclass of :class:`ExportError` rather than of ``ValueError``: nothing the caller passed was invalid; the
    export did not produce a correct program, so ``except hfexport.ExportError`` (the sweep's, a user's, the
    CLI's) treats it as the failed export it is; the CLI gives it its own exit status (3).

    Attributes:
        report: the :class:`VerificationReport` (per output: max abs and rel diff, tolerance, note).
        exported: the artifact that failed, its manifest holding the report (``passed: false``); save it with
            ``exported.save_pretrained(...)`` to inspect it (``hfexport verify DIR`` re-runs its stored inputs).
        component: the component that was verified (a task export verifies each of its programs).
    """

    def __init__(self, backend: str, model_class: str, report: VerificationReport, exported: Any = None,
                 component: str = DEFAULT_COMPONENT):
        self.report = report
        self.exported = exported
        self.component = component
        failing = [o for o in report.outputs if not o.ok]
        summary = (f"{len(failing)} of {len(report.outputs)} outputs differ from eager PyTorch"
                   if report.outputs else "the artifact returned no outputs")
        super().__init__(backend, model_class, ValueError(summary), where="verification", internal=False)

    def _message(self) -> str:
        report = self.report
        if callable(getattr(report, "failure_message", None)):  # a quantized artifact's report says it its way
            return report.failure_message(self.backend, self.model_class, self.component)
        failing = [o for o in report.outputs if not o.ok]
        shapes = ", ".join(f"{k}={v}" for k, v in report.inputs.items())
        lines = [f"{self.backend} export of {self.model_class} failed verification: {self.cause}"
                 + (f" at {shapes}" if shapes else "")
                 + f" (|exported - eager| <= atol + rtol * |eager| with atol={report.atol:g}, rtol={report.rtol:g})"
                 + (f", component {self.component!r}" if self.component != DEFAULT_COMPONENT else "") + ":"]
        for o in failing:
            lines.append(f"  - {o.name} {list(o.shape)} {o.dtype}: max abs diff {o.max_abs_diff:.3e} where the "
                         f"tolerance is {o.tolerance:.3e}" + (f" ({o.note})" if o.note else ""))
        if report.diagnosis and report.diagnosis.get("summary"):
            lines.append(f"Diagnosis: {report.diagnosis['summary']}")
        lines.append("Pass verify=False to keep the artifact anyway (its manifest records the report, passed: "
                     "false), or atol=/rtol= to change the tolerances (CLI: --no-verify, --atol, --rtol); the "
                     "report is the error's .report, the artifact its .exported")
        return "\n".join(lines)


def _compare_tensors(e: Any, a: Any, atol: float, rtol: float) -> tuple[float, float, float, bool, str]:
    """``(max abs diff, max rel diff, tolerance, ok, note)`` of two tensors of one shape."""
    import torch

    if not (e.is_floating_point() or e.is_complex()):
        diff = (a.long() - e.long()).abs()
        equal = bool(torch.equal(a.to(e.dtype), e))
        top = float(diff.max()) if diff.numel() else 0.0
        return top, 0.0 if equal else float("inf"), 0.0, equal, ""
    ad, ed = (a.cdouble(), e.cdouble()) if e.is_complex() or a.is_complex() else (a.double(), e.double())
    a_nan, e_nan = torch.isnan(ad), torch.isnan(ed)
    same = (ad == ed) | (a_nan & e_nan)  # equal values, equal infinities, NaN on both sides
    diff = torch.where(same, torch.zeros((), dtype=torch.float64), (ad - ed).abs())  # NaN/Inf stay
    scale = torch.where(torch.isfinite(ed), ed.abs(), torch.zeros((), dtype=torch.float64))
    ok = bool(torch.all(diff <= atol + rtol * scale))  # a NaN difference is never within tolerance
    # relative only where eager's value is above atol: below it the absolute term decides, and |diff| / |eager|
    # near zero says nothing (1e-7 off an eager 1e-7 would read as 100%)
    rel = torch.where((diff == 0) | (scale <= atol), torch.zeros((), dtype=torch.float64), diff / scale)

    def top(t: Any) -> float:
        if not t.numel():
            return 0.0
        return float("nan") if bool(torch.isnan(t).any()) else float(t.max())

    notes = []
    for count, what in ((int((a_nan & ~e_nan).sum()), "NaN in the export where eager has none"),
                        (int((e_nan & ~a_nan).sum()), "NaN in eager where the export has none"),
                        (int((torch.isinf(ad) & ~same).sum()), "Inf in the export where eager differs"),
                        (int((torch.isinf(ed) & ~same).sum()), "Inf in eager where the export differs")):
        if count:
            notes.append(f"{count} {what}")
    tolerance = atol + rtol * (float(scale.max()) if scale.numel() else 0.0)
    return top(diff), top(rel), tolerance, ok, "; ".join(notes)


# Comparisons other than elementwise tolerances, keyed by the manifest section that asks for one: a quantized
# artifact (its ``quantization`` section) is compared with float eager by cosine similarity. hfexport._quantization
# registers it when hfexport is imported (a registry, so that this module does not import that one back).
COMPARISONS: dict[str, Callable[..., VerificationReport]] = {}


def compare_outputs(backend: str, expected: Any, actual: Any, atol: float, rtol: float) -> VerificationReport:
    """Compare two output pytrees leaf by leaf.

    NaN or Inf on one side only fails the output and is reported as NaN/Inf (never as a difference of 0.0).

    Raises:
        ValueError: the structures differ (names the leaves on each side).
    """
    import torch

    names, exp_leaves, exp_spec = flatten_with_names(expected)
    act_names, act_leaves, act_spec = flatten_with_names(actual)
    if len(exp_leaves) != len(act_leaves):
        raise ValueError(f"exported outputs {act_names} do not match eager outputs {names}")
    if names != act_names and sorted(names) == sorted(act_names):
        # The same leaves in another order: a ModelOutput rebuilt from the program's output spec lists its fields
        # in declaration order, where eager's lists them in the order forward set them (InternVL's image_outputs).
        by_name = dict(zip(act_names, act_leaves, strict=True))
        act_leaves = [by_name[name] for name in names]
    report = VerificationReport(backend, atol, rtol)
    for name, e, a in zip(names, exp_leaves, act_leaves, strict=True):
        if not isinstance(e, torch.Tensor):
            report.outputs.append(OutputDiff(name, (), type(e).__name__, 0.0 if e == a else float("inf"), e == a))
            continue
        if a is None or isinstance(a, str):
            report.outputs.append(OutputDiff(name, (), type(a).__name__, float("inf"), False, float("inf"),
                                             note=f"{a!r} in the export where eager has a tensor"))
            continue
        a = torch.as_tensor(a).to(e.device)
        dtype = str(e.dtype).replace("torch.", "")
        if a.shape != e.shape:
            report.outputs.append(OutputDiff(name, tuple(a.shape), dtype, float("inf"), False, float("inf"),
                                             note=f"shape {list(a.shape)} where eager has {list(e.shape)}"))
            continue
        abs_diff, rel_diff, tolerance, ok, note = _compare_tensors(e, a, atol, rtol)
        report.outputs.append(OutputDiff(name, tuple(e.shape), dtype, abs_diff, ok, rel_diff, tolerance, note))
    return report


def _shapes(inputs: Mapping[str, Any]) -> dict[str, Any]:
    """Input name -> shape (a list of leaf shapes for a pytree input; the value for a scalar)."""
    import torch.utils._pytree as pytree

    out: dict[str, Any] = {}
    for name, value in inputs.items():
        if hasattr(value, "shape"):
            out[name] = list(value.shape)
        else:
            leaves = pytree.tree_leaves(value)
            out[name] = [list(leaf.shape) if hasattr(leaf, "shape") else repr(leaf) for leaf in leaves]
    return out
