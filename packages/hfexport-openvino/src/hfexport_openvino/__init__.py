"""hfexport-openvino: the ``openvino`` backend (``openvino.convert_model`` of the dynamo trace), verified on
OpenVINO's CPU plugin.

Importing this package is light: it declares the backend for discovery. ``exporter_openvino`` (which imports
openvino) is imported when an export or load needs it.
"""

from typing import Any

from hfexport.plugin import Backend
from hfexport_dynamo import TASKS  # light: the names of the tasks its tracer plans

OPENVINO_BACKEND = Backend(
    name="openvino",
    exporter="hfexport_openvino.exporter_openvino:OpenVINOExporter",
    description="OpenVINO IR (openvino_model.xml + .bin), run on OpenVINO's CPU plugin",
    requires=("torch", "transformers", "openvino"),
    distribution="hfexport-openvino",
    install_hint="pip install hfexport-openvino",
    tasks=TASKS,
)

__all__ = ["OPENVINO_BACKEND", "OpenVINOConfig", "OpenVINOExporter", "OpenVINORunner"]


def __getattr__(name: str) -> Any:
    if name in ("OpenVINOConfig", "OpenVINOExporter", "OpenVINORunner"):
        from . import exporter_openvino

        return getattr(exporter_openvino, name)
    raise AttributeError(f"module 'hfexport_openvino' has no attribute {name!r}")
