"""Options of the ``onnx`` backend (:class:`OnnxConfig`), checked when the config is made."""

from __future__ import annotations

from dataclasses import dataclass

import onnx

from hfexport import Quantization
from hfexport_dynamo import DynamoConfig

from ._fusions import check_ort_fusions
from ._model import MIN_OPSET, TORCHLIB_OPSET
from ._quantize import resolve_onnx_quantization
from ._runner import available_providers

__all__ = ["OnnxConfig"]


@dataclass
class OnnxConfig(DynamoConfig):
    """Options of the ``onnx`` backend.

    Attributes:
        opset_version: the ONNX opset of the default domain. torch.onnx writes opset 18 and converts down
            to lower ones when the graph allows it; an opset lower than the graph needs fails the export.
        optimize: run the onnxscript optimizer (constant folding, inlining, dead code) on the model.
        optimize_fallback: when the optimizer cannot be used — the model class is in ``ONNX_DISABLE_OPTIMIZE``
            or the optimizer crashes — keep the unoptimized model (``True``, with a warning on a crash).
            ``False`` runs the optimizer even for a listed class and fails the export when it crashes: this is
            how an ``ONNX_DISABLE_OPTIMIZE`` entry is re-checked (``OnnxExporter.recheck_options``).
        providers: ONNX Runtime execution providers of the runner, in priority order.
        ort_fusions: the provider to fuse the optimized graph for with onnxscript's ONNX Runtime fusions
            (attention, layer norms, GELU, rotary: ``_fusions.py``), ``"cpu"``; ``None`` (or ``False``) writes
            plain ONNX ops. A class in ``ORT_FUSIONS_DISABLE``, a fusion that fails or a fused graph ONNX Runtime
            refuses exports unfused, with a warning; ``optimize_fallback=False`` makes those errors.
        quantize: a quantization recipe (or an ``hfexport.Quantization``), applied last in stage 5, before the
            session opens: ``"int8-dynamic"`` (ONNX Runtime's MatMulNBits, 8-bit, blockwise), ``"int4"`` (the same,
            4-bit, blocks of 32, for decoders), ``"int8-dynamic-per-tensor"`` or ``"int8-static"`` (QDQ, calibrated):
            ``_quantize.py``. The export is then
            verified against float eager by cosine similarity (``hfexport._quantization``).
    """

    opset_version: int = TORCHLIB_OPSET
    optimize: bool = True
    optimize_fallback: bool = True
    providers: tuple[str, ...] = ("CPUExecutionProvider",)
    ort_fusions: str | None = "cpu"
    quantize: str | Quantization | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        highest = onnx.defs.onnx_opset_version()
        if (isinstance(self.opset_version, bool) or not isinstance(self.opset_version, int)
                or not MIN_OPSET <= self.opset_version <= highest):
            raise ValueError(f"opset_version must be an int from {MIN_OPSET} to {highest} (onnx "
                             f"{onnx.__version__}); {TORCHLIB_OPSET} is what torch.onnx writes natively; "
                             f"got {self.opset_version!r}")
        for flag in ("optimize", "optimize_fallback"):
            if not isinstance(getattr(self, flag), bool):
                raise TypeError(f"{flag} must be True or False, got {getattr(self, flag)!r}")
        if isinstance(self.providers, str):
            self.providers = (self.providers,)
        self.providers = tuple(self.providers)
        available = available_providers()
        unknown = [p for p in self.providers if p not in available]
        if not self.providers or unknown:
            raise ValueError(f"providers must name execution providers of the installed onnxruntime; "
                             f"{unknown or 'none given'} not available; valid values: {', '.join(available)}")
        self.ort_fusions = check_ort_fusions(self.ort_fusions)
        if self.quantize is not None:  # a float export reads no quantization code
            self.quantize = resolve_onnx_quantization(self.quantize)
        if self.quantize is not None and not self.optimize:
            # ONNX Runtime's quantizers take a MatMul over a constant weight; unoptimized, a Linear's weight reaches its
            # MatMul through a Transpose, so all but a tied head stayed float, with a passing verification
            raise ValueError(f"quantize={self.quantize.recipe!r} needs optimize=True: unoptimized, the weights reach "
                             "their MatMul through a Transpose that only the optimizer folds, and ONNX Runtime's "
                             "quantizers leave such a MatMul float")
