"""hfexport-onnx: the ``onnx`` backend (torch.onnx dynamo exporter), verified on ONNX Runtime.

Importing this package is light: it declares the backend for discovery. ``exporter_onnx`` (which imports
onnx, onnxscript and onnxruntime) is imported when an export or load needs it.
"""

from typing import Any

from hfexport.plugin import Backend
from hfexport_dynamo import TASKS  # light: the names of the tasks its tracer plans

ONNX_BACKEND = Backend(
    name="onnx",
    exporter="hfexport_onnx.exporter_onnx:OnnxExporter",
    description="ONNX model (model.onnx + model.onnx.data), run on ONNX Runtime",
    requires=("torch", "transformers", "onnx", "onnxscript", "onnx-ir", "onnxruntime"),
    distribution="hfexport-onnx",
    install_hint="pip install hfexport-onnx",
    tasks=TASKS,
)

__all__ = ["ONNX_BACKEND", "OnnxConfig", "OnnxExporter", "OnnxRunner", "ONNX_DISABLE_OPTIMIZE", "ORT_FUSIONS_DISABLE"]


def __getattr__(name: str) -> Any:
    if name in ("OnnxConfig", "OnnxExporter", "ONNX_DISABLE_OPTIMIZE", "ORT_FUSIONS_DISABLE", "OnnxRunner"):
        from . import exporter_onnx

        return getattr(exporter_onnx, name)
    raise AttributeError(f"module 'hfexport_onnx' has no attribute {name!r}")
