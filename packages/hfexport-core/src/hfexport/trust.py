"""Reading an artifact as untrusted input: the helpers a backend's ``load_runner`` uses to check what its runtime
will read (allow-listed pickles and pytree types, JSON, dtypes)."""

from ._artifact_files import (
    artifact_bytes,
    artifact_descriptor,
    descriptor_path,
    hub_blobs,
    open_beneath,
    read_beneath,
)
from ._named_types import (
    allow_pytree_types,
    allowed_pytree_type,
    check_treespec,
    import_type_modules,
    importable_prefixes,
    load_treespec,
    torch_dtype,
    treespec_names,
    unregistered,
)
from ._pickle_globals import SAFE_PICKLE_GLOBALS, pickle_globals, unsafe_pickle_globals
from ._trust import parse_json

__all__ = [
    "SAFE_PICKLE_GLOBALS", "allow_pytree_types", "allowed_pytree_type", "artifact_bytes", "artifact_descriptor",
    "check_treespec", "descriptor_path", "hub_blobs",
    "import_type_modules", "importable_prefixes", "load_treespec", "open_beneath", "parse_json", "pickle_globals",
    "read_beneath", "torch_dtype", "treespec_names", "unregistered", "unsafe_pickle_globals"
]
