"""hfexport: export Hugging Face Transformers models and any ``torch.nn.Module`` through ``torch.export``.

The user API: :func:`export`, :func:`load`, the artifact (:class:`ExportedModel`), discovery of installed
backends, and the workaround registry. Importing it is cheap (no torch); backends are found through the
``hfexport.backends`` entry points. Backend and plugin authors import from :mod:`hfexport.plugin`.
"""

from ._api import export, load
from ._artifact import ExportedModel, OutputDiff, VerificationError, VerificationReport
from ._discovery import Backend, BackendInfo, UnknownBackendError, get_backend, list_backends
from ._exporter import ExportConfig, ExportContext, Exporter, InvalidInputError
from ._fx import FixReport, apply_fx_node_fixes, apply_fx_program_fixes, iter_graph_modules
from ._patching import (
    PatchReport,
    UnresolvedPatchWarning,
    UnresolvedTarget,
    patch_context,
    resolve_path,
    resolve_pattern,
)
from ._quantization import Quantization, QuantizedVerificationReport
from ._registry import (
    Registration,
    list_fx_node_fixes,
    list_fx_program_fixes,
    list_patches,
    list_workarounds,
    register_fx_node_fix,
    register_fx_program_fix,
    register_patch,
    workarounds_for,
)
from ._stages import ExportError, Stage, StageEvent, run_stages
from ._trust import IntegrityError, ManifestError, UntrustedArtifactError

__version__ = "0.1.0"

__all__ = [
    "Backend", "BackendInfo", "ExportConfig", "ExportContext", "ExportError", "ExportedModel", "Exporter",
    "FixReport", "IntegrityError", "InvalidInputError", "ManifestError", "OutputDiff", "PatchReport", "Quantization",
    "QuantizedVerificationReport", "Registration", "Stage", "StageEvent",
    "UnknownBackendError", "UnresolvedPatchWarning", "UntrustedArtifactError", "UnresolvedTarget", "VerificationError", "VerificationReport", "apply_fx_node_fixes",
    "apply_fx_program_fixes", "export", "get_backend", "iter_graph_modules", "list_backends",
    "list_fx_node_fixes", "list_fx_program_fixes", "list_patches", "list_workarounds", "load", "patch_context",
    "register_fx_node_fix", "register_fx_program_fix", "register_patch", "resolve_path", "resolve_pattern",
    "run_stages", "workarounds_for",
]
