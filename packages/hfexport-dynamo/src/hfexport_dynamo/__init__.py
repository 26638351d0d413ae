"""hfexport-dynamo: the ``dynamo`` backend (``torch.export`` to ``.pt2``) and Transformers model support.

Importing this package is light: it declares the backend for discovery. The exporter (and torch) is
imported when an export or load needs it.
"""

from typing import Any

from hfexport import Backend

DYNAMO_BACKEND = Backend(
    name="dynamo",
    exporter="hfexport_dynamo.exporter_dynamo:DynamoExporter",
    description="torch.export program (.pt2), run with torch.export.load",
    requires=("torch", "transformers"),
)

__all__ = ["DYNAMO_BACKEND", "DynamoConfig", "DynamoExporter", "EXPORT_SKIPS", "register_cache_type"]


def __getattr__(name: str) -> Any:
    if name in ("DynamoConfig", "DynamoExporter", "EXPORT_SKIPS", "DynamoRunner"):
        from . import exporter_dynamo

        return getattr(exporter_dynamo, name)
    if name == "register_cache_type":
        from ._pytree import register_cache_type

        return register_cache_type
    raise AttributeError(f"module 'hfexport_dynamo' has no attribute {name!r}")
