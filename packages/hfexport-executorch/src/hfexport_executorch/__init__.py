"""hfexport-executorch: ExecuTorch backends (``executorch-xnnpack``, ``executorch-cuda``).

Importing this package is light: it declares the backends for discovery. ``exporter_executorch`` (which
imports executorch) is imported when an export or load needs it.
"""

from typing import Any

from hfexport import Backend

_REQUIRES = ("torch", "transformers", "executorch")

XNNPACK_BACKEND = Backend(
    name="executorch-xnnpack",
    exporter="hfexport_executorch.exporter_executorch:XnnpackExporter",
    description="ExecuTorch program (.pte) delegated to XNNPACK (CPU), run on the ExecuTorch runtime",
    requires=_REQUIRES,
)
CUDA_BACKEND = Backend(
    name="executorch-cuda",
    exporter="hfexport_executorch.exporter_executorch:CudaExporter",
    description="ExecuTorch program (.pte) for CUDA (bfloat16, needs a visible GPU)",
    requires=_REQUIRES,
)

_LAZY = ("ExecutorchConfig", "ExecutorchExporter", "XnnpackExporter", "CudaExporter", "ExecutorchRunner",
         "register_backend_prepare", "place_model_and_inputs", "BackendPreparation", "backend_variants")

__all__ = ["CUDA_BACKEND", "XNNPACK_BACKEND", *_LAZY]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        from . import exporter_executorch

        return getattr(exporter_executorch, name)
    raise AttributeError(f"module 'hfexport_executorch' has no attribute {name!r}")
