"""hfexport-executorch: ExecuTorch backends (``executorch-xnnpack``, ``executorch-cuda``).

Importing this package is light: it declares the backends for discovery. The public names below are imported
lazily; ``exporter_executorch`` (and executorch itself, inside the stages and the runner) when an export or a
load needs it. A vendor's variant builds on :func:`register_backend_prepare`, :class:`BackendPreparation`,
:func:`place_model_and_inputs` and :class:`ExecutorchExporter` (see the test plugin ``hfexport-etportable``).
"""

from typing import Any

from hfexport.plugin import Backend
from hfexport_dynamo import TASKS  # light: the names of the tasks its tracer plans

_REQUIRES = ("torch", "transformers", "executorch")
_DISTRIBUTION = dict(distribution="hfexport-executorch", install_hint="pip install hfexport-executorch", tasks=TASKS)

XNNPACK_BACKEND = Backend(
    name="executorch-xnnpack",
    exporter="hfexport_executorch.exporter_executorch:XnnpackExporter",
    description="ExecuTorch program (.pte) delegated to XNNPACK (CPU), run on the ExecuTorch runtime",
    requires=_REQUIRES,
    **_DISTRIBUTION,
)
CUDA_BACKEND = Backend(
    name="executorch-cuda",
    exporter="hfexport_executorch.exporter_executorch:CudaExporter",
    description="ExecuTorch program (.pte) for CUDA (bfloat16, needs a visible GPU)",
    requires=_REQUIRES,
    device="cuda",
    **_DISTRIBUTION,
)

# public name -> the module of this package that defines it
_LAZY = {
    "ExecutorchConfig": "_config", "ExecutorchExporter": "exporter_executorch",
    "XnnpackExporter": "exporter_executorch", "CudaExporter": "exporter_executorch",
    "ExecutorchRunner": "_runner", "PROGRAM_FILE": "_runner",
    "BackendPreparation": "_variants", "register_backend_prepare": "_variants",
    "place_model_and_inputs": "_variants", "backend_variants": "_variants",
    "DelegationReport": "_delegation", "delegation_report": "_delegation", "portable_kernel_names": "_delegation",
    "DEFAULT_DIM_UPPER_BOUND": "_bounds",
}

__all__ = ["CUDA_BACKEND", "XNNPACK_BACKEND", *_LAZY]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
    raise AttributeError(f"module 'hfexport_executorch' has no attribute {name!r}")
