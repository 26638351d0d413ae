"""The workaround machinery beyond registering (``hfexport.plugin``): patch contexts, FX fix application, the
registry's queries."""

from ._fx import FixReport, apply_fx_node_fixes, apply_fx_program_fixes, iter_graph_modules
from ._patching import PatchReport, UnresolvedTarget, patch_context, resolve_path, resolve_pattern
from ._registry import is_disabled, workarounds_for

__all__ = [
    "FixReport", "PatchReport", "UnresolvedTarget", "apply_fx_node_fixes", "apply_fx_program_fixes",
    "is_disabled", "iter_graph_modules", "patch_context", "resolve_path", "resolve_pattern", "workarounds_for"
]
