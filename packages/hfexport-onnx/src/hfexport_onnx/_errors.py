"""Conversion and session errors, the optimizer-fallback warning, failure texts and hints, and torch.onnx's
noise filter."""

from __future__ import annotations

import contextlib
import logging
import warnings
from collections.abc import Iterator

from ._model import TORCHLIB_OPSET, UnsupportedOpsetError

__all__ = ["OnnxConversionError", "OnnxSessionError", "OptimizerFallbackWarning", "failure_text", "onnx_hints",
           "quiet_onnx_passes", "quiet_torch_onnx"]


class OnnxConversionError(RuntimeError):
    """``torch.onnx.export`` failed; the message leads with the innermost error (the op or node at fault)."""


class OnnxSessionError(RuntimeError):
    """ONNX Runtime refused the model; the message names the node and op it refused."""


class OptimizerFallbackWarning(UserWarning):
    """The onnxscript optimizer crashed; the unoptimized model was kept."""


def failure_text(exc: BaseException) -> str:
    """``Type: message`` of the innermost cause (the optimizer wraps the real error in a PassError)."""
    chain = []
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        chain.append(exc)
        # what a traceback shows as "the above exception was the direct cause of / during handling of"
        exc = exc.__cause__ if exc.__cause__ is not None else (  # type: ignore[assignment]
            None if exc.__suppress_context__ else exc.__context__)
    root = chain[-1]
    first = str(root).strip().splitlines()[0][:200] if str(root).strip() else ""
    outer = f"{type(chain[0]).__name__} ← " if len(chain) > 1 else ""
    return f"{outer}{type(root).__name__}: {first}"


class _DropNoise(logging.Filter):
    """torch.onnx logs 'torchvision is not installed. Skipping torchvision::nms' (4 lines) on every export."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "torchvision is not installed" not in record.getMessage()


@contextlib.contextmanager
def _filtered(names: tuple[str, ...], drop: logging.Filter) -> Iterator[None]:
    """Within the body, ``drop`` filters the records of the loggers ``names``; removed after."""
    loggers = [logging.getLogger(name) for name in names]
    for lg in loggers:
        lg.addFilter(drop)
    try:
        yield
    finally:
        for lg in loggers:
            lg.removeFilter(drop)


@contextlib.contextmanager
def quiet_torch_onnx() -> Iterator[None]:
    """Drop torch.onnx's log lines and re-warnings about what the exporter already handled."""
    with _filtered(("torch.onnx._internal.exporter._registration",), _DropNoise()), warnings.catch_warnings():
        # torch.onnx re-warns about things the exporter already handled (deprecated dynamic_axes, ...).
        warnings.filterwarnings("ignore", category=DeprecationWarning)
        warnings.filterwarnings("ignore", category=FutureWarning)
        yield


# The loggers of recoverable failures inside onnxscript's optimizer and fusions: a node constant folding cannot
# evaluate ("Evaluation failed: Axis must be a rank-0 tensor", once per node and pass) and a model ONNX shape inference
# cannot type ("Shape inference failed: ... Model is left unchanged", with its traceback); either pass goes on.
_PASS_LOGGERS = ("onnxscript.optimizer._constant_folding", "onnx_ir.passes.common.shape_inference")


class _DropWarnings(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno > logging.WARNING


@contextlib.contextmanager
def quiet_onnx_passes() -> Iterator[None]:
    """Within the body, the warnings of :data:`_PASS_LOGGERS` are dropped (errors still show), unless
    ``hfexport --verbose``: what the optimizer and the fusions could not do is recorded in the manifest, and a
    wrong result would fail the export's verification."""
    from hfexport.commands import verbose

    if verbose():
        yield
        return
    with _filtered(_PASS_LOGGERS, _DropWarnings()):
        yield


def onnx_hints(exc: BaseException) -> list[str]:
    """Next steps for an ONNX failure (shown under the ExportError); empty when there is nothing specific."""
    text = f"{type(exc).__name__}: {exc}"
    if isinstance(exc, UnsupportedOpsetError):
        return [f"export with opset_version={TORCHLIB_OPSET} (the default) or higher"]
    if "No ONNX function found" in text or "DispatchError" in text:
        return ["add an `_aten_<op>` translation to hfexport_onnx/workarounds/translations.py (_ONNX_TRANSLATION_TABLE: "
                '@register_workaround("onnx_translation", "onnx", target=<the aten op>)), or an '
                "@register_patch('onnx', ...) that avoids the op",
                "see the full traceback above (the original error is chained)"]
    if isinstance(exc, OnnxSessionError):
        return ["try optimize=False (an optimizer rewrite may have produced the node), or another opset_version",
                "if the op is missing from ONNX Runtime, add an `_aten_<op>` translation that avoids it"]
    return []
