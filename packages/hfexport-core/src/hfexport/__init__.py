"""hfexport: export Hugging Face Transformers models and any ``torch.nn.Module`` through ``torch.export``.

The user API, and nothing else: :func:`export` and :func:`load`, the artifact (:class:`ExportedModel`) and its
verification report, :class:`Quantization`, the errors an export or a load raises, discovery of installed backends
(:func:`list_backends`, :func:`get_backend`), and registering or listing workarounds (:func:`register_patch`,
:func:`list_workarounds`). Importing it is cheap (no torch); backends are found through the ``hfexport.backends``
entry points. Backend and plugin authors import from :mod:`hfexport.plugin`; command plugins from
:mod:`hfexport.commands`.
"""

from ._api import export, load
from ._artifact import ExportedModel, VerificationError, VerificationReport
from ._cost import InsufficientResourcesError
from ._discovery import BackendInfo, UnknownBackendError, get_backend, list_backends
from ._exporter import InvalidInputError
from ._patching import UnresolvedPatchWarning
from ._quantization import Quantization
from ._registry import list_workarounds, register_patch
from ._stages import ExportError
from ._trust import IntegrityError, ManifestError, UntrustedArtifactError

__version__ = "0.1.0"

__all__ = [
    "BackendInfo", "ExportError", "ExportedModel", "InsufficientResourcesError", "IntegrityError",
    "InvalidInputError", "ManifestError", "Quantization", "UnknownBackendError", "UnresolvedPatchWarning",
    "UntrustedArtifactError", "VerificationError", "VerificationReport", "export", "get_backend", "list_backends",
    "list_workarounds", "load", "register_patch",
]
