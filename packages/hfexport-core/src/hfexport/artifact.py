"""What an artifact is made of, for backends and tools: its manifest's constants and reader, output comparison,
versions."""

from ._artifact import (
    DEFAULT_COMPONENT,
    MANIFEST_NAME,
    SCHEMA_VERSION,
    OutputDiff,
    compare_outputs,
    flatten_with_names,
    read_manifest,
    versions_of,
)
from ._stages import StagePath

__all__ = [
    "DEFAULT_COMPONENT", "MANIFEST_NAME", "OutputDiff", "SCHEMA_VERSION", "StagePath", "compare_outputs",
    "flatten_with_names", "read_manifest", "versions_of"
]
