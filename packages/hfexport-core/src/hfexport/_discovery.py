"""Backend discovery through the ``hfexport.backends`` entry point group.

An entry point names a :class:`Backend` object in a light module (``hfexport_onnx:ONNX_BACKEND``). Loading
it imports only that module: the toolchain (torch.onnx, onnxscript, executorch) is imported when an export
or a load actually needs the exporter class.

Environment:
    HFEXPORT_DISABLE_PLUGIN_AUTOLOAD=1: load only the first-party backends (distributions ``hfexport-*``
        that ship with hfexport); third-party plugins are listed as ``disabled``.
    HFEXPORT_BLOCK_PLUGINS=name1,name2: never load these entry points (a broken plugin you cannot uninstall).
"""

from __future__ import annotations

import importlib
import os
from dataclasses import dataclass
from importlib import metadata

__all__ = ["Backend", "BackendInfo", "UnknownBackendError", "get_backend", "list_backends"]

GROUP = "hfexport.backends"
FIRST_PARTY = {"hfexport-core", "hfexport-dynamo", "hfexport-onnx", "hfexport-executorch"}
# Names we ship, and the distribution that brings them: used to say what to install.
FIRST_PARTY_NAMES = {
    "dynamo": "hfexport-dynamo",
    "onnx": "hfexport-onnx",
    "executorch": "hfexport-executorch",
    "executorch-xnnpack": "hfexport-executorch",
    "executorch-cuda": "hfexport-executorch",
}


@dataclass(frozen=True)
class Backend:
    """What a backend distribution declares through its entry point.

    Attributes:
        name: the backend name users pass (``"onnx"``, ``"executorch-xnnpack"``).
        exporter: ``"module:Class"`` of the exporter, imported lazily.
        description: one line for ``hfexport backends``.
        requires: distributions the toolchain needs; checked from metadata when the backend is loaded,
            so that a missing toolchain is reported before any export starts.
    """

    name: str
    exporter: str
    description: str = ""
    requires: tuple[str, ...] = ()

    def missing_requirements(self) -> list[str]:
        missing = []
        for dist in self.requires:
            try:
                metadata.version(dist)
            except metadata.PackageNotFoundError:
                missing.append(dist)
        return missing

    def load_exporter(self) -> type:
        """Import and return the exporter class.

        Raises:
            ImportError: naming the missing distributions, or the import failure of the exporter module.
            TypeError: if the named object is not an :class:`hfexport.Exporter` subclass.
        """
        from ._exporter import Exporter

        missing = self.missing_requirements()
        if missing:
            raise ImportError(f"backend {self.name!r} needs {', '.join(missing)}: pip install {' '.join(missing)}")
        module_name, _, attr = self.exporter.partition(":")
        cls = getattr(importlib.import_module(module_name), attr)
        if not (isinstance(cls, type) and issubclass(cls, Exporter)):
            raise TypeError(f"backend {self.name!r}: {self.exporter} is not an hfexport.Exporter subclass")
        return cls


@dataclass(frozen=True)
class BackendInfo:
    """One entry of :func:`list_backends`.

    Attributes:
        name: the entry point name.
        value: the entry point value (``"hfexport_onnx:ONNX_BACKEND"``).
        distribution: the distribution that declares it, and its ``version``.
        status: ``"ok"``, ``"error"`` (the plugin's module failed to import or is invalid: see ``error``),
            ``"missing"`` (a toolchain distribution is not installed: see ``error``) or ``"disabled"``.
        backend: the loaded :class:`Backend`, when status is ``"ok"`` or ``"missing"``.
    """

    name: str
    value: str
    distribution: str
    version: str
    status: str
    error: str = ""
    backend: Backend | None = None


class UnknownBackendError(LookupError):
    """The backend name is not installed, or its plugin is broken. The message says what to install."""


def _blocked() -> set[str]:
    return {n.strip() for n in os.environ.get("HFEXPORT_BLOCK_PLUGINS", "").split(",") if n.strip()}


def _load_entry_point(ep: metadata.EntryPoint, dist_name: str) -> tuple[str, str, Backend | None]:
    if ep.name in _blocked():
        return "disabled", "blocked by HFEXPORT_BLOCK_PLUGINS", None
    if os.environ.get("HFEXPORT_DISABLE_PLUGIN_AUTOLOAD") and dist_name not in FIRST_PARTY:
        return "disabled", "HFEXPORT_DISABLE_PLUGIN_AUTOLOAD is set", None
    try:
        obj = ep.load()
    except Exception as exc:  # a broken plugin must not break the listing: report it
        return "error", f"import of {ep.value} raised {type(exc).__name__}: {exc}", None
    if not isinstance(obj, Backend):
        return "error", f"{ep.value} is a {type(obj).__name__}, not an hfexport.Backend", None
    if obj.name != ep.name:
        obj = Backend(ep.name, obj.exporter, obj.description, obj.requires)
    missing = obj.missing_requirements()
    if missing:
        return "missing", f"needs {', '.join(missing)} (pip install {' '.join(missing)})", obj
    return "ok", "", obj


def list_backends(load: bool = True) -> list[BackendInfo]:
    """Every backend declared in the ``hfexport.backends`` entry point group, sorted by name.

    Args:
        load: import each plugin's light module to validate it (never the toolchain). With ``False``,
            only metadata is read and ``status`` is ``"unloaded"``.
    """
    infos = []
    for ep in metadata.entry_points(group=GROUP):
        dist = getattr(ep, "dist", None)
        dist_name = dist.metadata["Name"] if dist is not None else "?"
        version = dist.version if dist is not None else "?"
        if load:
            status, error, backend = _load_entry_point(ep, dist_name)
        else:
            status, error, backend = "unloaded", "", None
        infos.append(BackendInfo(ep.name, ep.value, dist_name, version, status, error, backend))
    return sorted(infos, key=lambda i: i.name)


def get_backend(name: str) -> Backend:
    """The :class:`Backend` registered under ``name``.

    Raises:
        UnknownBackendError: the name is not installed (the message lists installed backends and, for a
            first-party name, the distribution to install), or its plugin failed to load (the message
            says why).
    """
    infos = list_backends()
    for info in infos:
        if info.name == name:
            if info.backend is not None and info.status == "ok":
                return info.backend
            raise UnknownBackendError(
                f"backend {name!r} from {info.distribution} {info.version} is not usable ({info.status}): {info.error}")
    usable = [i.name for i in infos if i.status == "ok"] or ["none"]
    message = f"unknown backend {name!r}. Installed backends: {', '.join(usable)}."
    broken = [f"{i.name} ({i.status}: {i.error})" for i in infos if i.status not in ("ok",)]
    if broken:
        message += f" Not usable: {'; '.join(broken)}."
    dist = FIRST_PARTY_NAMES.get(name) or ("hfexport-executorch" if name.startswith("executorch-") else None)
    if dist:
        message += f" Backend {name!r} ships in {dist}: pip install {dist}"
    else:
        message += f" A third-party backend is installed as its own distribution (pip install hfexport-{name})."
    raise UnknownBackendError(message)
