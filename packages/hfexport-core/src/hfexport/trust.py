"""Reading an artifact as untrusted input: the helpers a backend's ``load_runner`` uses to check what its runtime
will read (allow-listed pickles and pytree types, JSON, dtypes)."""

from ._trust import (
    SAFE_PICKLE_GLOBALS,
    allow_pytree_types,
    allowed_pytree_type,
    artifact_bytes,
    check_treespec,
    hub_blobs,
    import_type_modules,
    importable_prefixes,
    load_treespec,
    open_beneath,
    parse_json,
    pickle_globals,
    read_beneath,
    torch_dtype,
    treespec_names,
    unregistered,
    unsafe_pickle_globals,
)

__all__ = [
    "SAFE_PICKLE_GLOBALS", "allow_pytree_types", "allowed_pytree_type", "artifact_bytes", "check_treespec", "hub_blobs",
    "import_type_modules", "importable_prefixes", "load_treespec", "open_beneath", "parse_json", "pickle_globals",
    "read_beneath", "torch_dtype", "treespec_names", "unregistered", "unsafe_pickle_globals"
]
