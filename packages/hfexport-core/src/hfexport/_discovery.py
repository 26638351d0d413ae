"""Backend discovery through the ``hfexport.backends`` entry point group.

An entry point names a :class:`Backend` object in a light module (``hfexport_onnx:ONNX_BACKEND``). Loading
it imports only that module: the toolchain (torch.onnx, onnxscript, executorch) is imported when an export
or a load actually needs the exporter class.

The kernel names no backend: each :class:`Backend` says which distribution brings it and how to install
it, and an unknown name gets the installed backends listed.

Environment:
    HFEXPORT_DISABLE_PLUGIN_AUTOLOAD=1: load no backend entry point except those named in ``HFEXPORT_PLUGINS``
        (as pytest's ``PYTEST_DISABLE_PLUGIN_AUTOLOAD`` with ``-p``); the others are listed as ``disabled``.
    HFEXPORT_PLUGINS=name1,name2: the backends to load when autoload is disabled (e.g. ``dynamo,onnx``).
    HFEXPORT_BLOCK_PLUGINS=name1,name2: never load these entry points (a broken plugin you cannot uninstall).
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib
import os
from dataclasses import dataclass
from importlib import metadata

__all__ = ["Backend", "BackendInfo", "UnknownBackendError", "get_backend", "list_backends"]

GROUP = "hfexport.backends"


@dataclass(frozen=True)
class Backend:
    """What a backend distribution declares through its entry point.

    Attributes:
        name: the backend name users pass (``"onnx"``, ``"executorch-xnnpack"``).
        exporter: ``"module:Class"`` of the exporter, imported lazily.
        description: one line for ``hfexport backends``.
        requires: distributions the toolchain needs; checked from metadata when the backend is loaded,
            so that a missing toolchain is reported before any export starts.
        distribution: the distribution that ships this backend (``"hfexport-onnx"``), for error messages.
        install_hint: how to install it (default ``pip install <distribution>``).
        device: the accelerator its exports need (``"cuda"``), if any: ``hfexport backends`` says when none is
            visible, without importing the toolchain.
        tasks: the ``task=`` names its exports take (its tracer's ``plan_task``); the CLI refuses another before
            it loads a model. Empty: not declared (the export itself says).
    """

    name: str
    exporter: str
    description: str = ""
    requires: tuple[str, ...] = ()
    distribution: str = ""
    install_hint: str = ""
    device: str = ""
    tasks: tuple[str, ...] = ()

    @property
    def install(self) -> str:
        return self.install_hint or (f"pip install {self.distribution}" if self.distribution else "")

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
            TypeError: if the named object is not an :class:`hfexport.plugin.Exporter` subclass.
        """
        from ._exporter import Exporter, RuntimeNeeds
        from ._stages import Stage, Step

        missing = self.missing_requirements()
        if missing:
            raise ImportError(f"backend {self.name!r} needs {', '.join(missing)}: pip install {' '.join(missing)}"
                              + (f" (or {self.install})" if self.install else ""))
        module_name, _, attr = self.exporter.partition(":")
        cls = getattr(importlib.import_module(module_name), attr)
        if not (isinstance(cls, type) and issubclass(cls, Exporter)):
            raise TypeError(f"backend {self.name!r}: {self.exporter} is not an hfexport.plugin.Exporter subclass")
        # Validated when it loads, not halfway through an export (or, for `name`, in every manifest it writes).
        problems = []
        if cls.name == Exporter.name:
            problems.append("must set `name` (the backend name written into every manifest)")
        if not cls.stages and not cls.steps:
            problems.append("must declare `stages` (or `steps`)")
        if not all(isinstance(s, Stage) for s in cls.stages) or not all(isinstance(s, Step) for s in cls.steps):
            problems.append("`stages` must hold hfexport.plugin.Stage objects and `steps` Step objects")
        elif [s.number for s in cls.stages] != list(range(1, len(cls.stages) + 1)):  # ctx.stage(n) is stages[n - 1]
            problems.append(f"`stages` must be numbered 1 to {len(cls.stages)} in order, got "
                            f"{[s.number for s in cls.stages]}")
        if not isinstance(cls.needs, RuntimeNeeds | property):  # a property: needs that depend on the config
            problems.append("`needs` must be an hfexport.plugin.RuntimeNeeds")
        missing_protocol = [m for m in ("capture", "program_manifest", "reference", "check_inputs", "prepare_inputs",
                                        "extra_files", "prepare_load", "second_shape_inputs")
                            if cls.tracer is not None and not callable(getattr(cls.tracer, m, None))]
        if cls.tracer is not None and not isinstance(getattr(cls.tracer, "stages", None), tuple):
            missing_protocol.append("stages")
        if cls.tracer is None:
            problems.append("must set `tracer` (hfexport_dynamo.DYNAMO_TRACER: it captures the model)")
        elif missing_protocol:
            problems.append(f"its tracer lacks {', '.join(missing_protocol)} (the hfexport.plugin.Tracer protocol)")
        if cls.package is Exporter.package:
            problems.append("must implement package()")
        if cls.load_runner.__func__ is Exporter.load_runner.__func__:  # type: ignore[attr-defined]
            problems.append("must implement load_runner()")
        if problems:
            source = f", distribution {self.distribution}" if getattr(self, "distribution", None) else ""
            raise TypeError(f"backend {self.name!r} (entry point of group hfexport.backends{source}): its exporter "
                            f"{self.exporter} " + "; ".join(problems))
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
        alias_of: the name the backend declares itself, when the entry point gives it another one (``executorch``
            for ``executorch-xnnpack``); else ``""``.
    """

    name: str
    value: str
    distribution: str
    version: str
    status: str
    error: str = ""
    backend: Backend | None = None
    alias_of: str = ""

    @property
    def note(self) -> str:
        """What the listing adds: ``"another name of executorch-xnnpack"`` for an entry point whose backend has
        another name, ``"needs a GPU; none is visible"`` for a usable CUDA backend on a machine that shows no
        NVIDIA device."""
        notes = [f"another name of {self.alias_of}"] if self.alias_of else []
        if self.status == "ok" and self.backend is not None and self.backend.device == "cuda" and not cuda_visible():
            notes.append("needs a GPU; none is visible")
        return "; ".join(notes)


def cuda_visible() -> bool:
    """Whether this process can see an NVIDIA GPU, from the driver's device files and ``CUDA_VISIBLE_DEVICES``
    (no torch import: ``hfexport backends`` stays instant). A listing's hint; an export checks with torch."""
    hidden = os.environ.get("CUDA_VISIBLE_DEVICES")
    if hidden is not None and hidden.strip() in ("", "-1"):
        return False
    gpus = "/proc/driver/nvidia/gpus"
    return (os.path.isdir(gpus) and bool(os.listdir(gpus))) or os.path.exists("/dev/nvidia0")


class UnknownBackendError(LookupError):
    """The backend name is not installed, or its plugin is broken. The message says what to install."""


def _blocked() -> set[str]:
    return {n.strip() for n in os.environ.get("HFEXPORT_BLOCK_PLUGINS", "").split(",") if n.strip()}


def _allowed() -> set[str]:
    return {n.strip() for n in os.environ.get("HFEXPORT_PLUGINS", "").split(",") if n.strip()}


def _load_entry_point(ep: metadata.EntryPoint, dist_name: str,
                      version: str) -> tuple[str, str, Backend | None, str]:
    """``(status, error, backend, alias_of)``: the backend renamed to the entry point's name, and the name it
    declares itself when that differs (else ``""``)."""
    if ep.name in _blocked():
        return "disabled", "blocked by HFEXPORT_BLOCK_PLUGINS", None, ""
    if os.environ.get("HFEXPORT_DISABLE_PLUGIN_AUTOLOAD") and ep.name not in _allowed():
        return "disabled", "HFEXPORT_DISABLE_PLUGIN_AUTOLOAD is set and HFEXPORT_PLUGINS does not name it", None, ""
    try:
        obj = ep.load()
    except Exception as exc:  # a broken plugin must not break the listing: report it
        return "error", f"import of {ep.value} raised {type(exc).__name__}: {exc}", None, ""
    if not isinstance(obj, Backend):
        return "error", f"{ep.value} is a {type(obj).__name__}, not an hfexport.plugin.Backend", None, ""
    alias_of = obj.name if obj.name != ep.name else ""
    if obj.name != ep.name or not obj.distribution:
        obj = dataclasses.replace(obj, name=ep.name, distribution=obj.distribution or dist_name)
    missing = obj.missing_requirements()
    if missing:
        return "missing", f"needs {', '.join(missing)} (pip install {' '.join(missing)})", obj, alias_of
    return "ok", "", obj, alias_of


def _info(ep: metadata.EntryPoint, load: bool) -> BackendInfo:
    dist = getattr(ep, "dist", None)
    dist_name = dist.metadata["Name"] if dist is not None else "?"
    version = dist.version if dist is not None else "?"
    if load:
        status, error, backend, alias_of = _load_entry_point(ep, dist_name, version)
    else:
        status, error, backend, alias_of = "unloaded", "", None, ""
    return BackendInfo(ep.name, ep.value, dist_name, version, status, error, backend, alias_of)


def list_backends(load: bool = True) -> list[BackendInfo]:
    """Every backend declared in the ``hfexport.backends`` entry point group, sorted by name.

    Args:
        load: import each plugin's light module to validate it (never the toolchain). With ``False``,
            only metadata is read and ``status`` is ``"unloaded"``.
    """
    return sorted((_info(ep, load) for ep in metadata.entry_points(group=GROUP)), key=lambda i: i.name)


def get_backend(name: str) -> Backend:
    """The :class:`Backend` registered under ``name``; imports only that entry point's module.

    Raises:
        UnknownBackendError: the name is not installed (the message lists the installed backends, read
            from metadata), or its plugin failed to load (the message says why and what to install).
    """
    if not isinstance(name, str) or not name:
        raise TypeError(f"backend must be a backend name such as 'dynamo' or 'onnx', got {name!r}")
    for ep in metadata.entry_points(group=GROUP, name=name):
        info = _info(ep, load=True)
        if info.backend is not None and info.status == "ok":
            return info.backend
        hint = f" ({info.backend.install})" if info.backend is not None and info.backend.install else ""
        raise UnknownBackendError(f"backend {name!r} from {info.distribution} {info.version} is not usable "
                                  f"({info.status}): {info.error}{hint}")
    raise UnknownBackendError(_unknown_backend_message(name))


def _unknown_backend_message(name: str) -> str:
    """Did-you-mean among the installed names, the listing, and install advice only for a family that exists.

    A name whose prefix is the family of an installed backend (``executorch-foo``: the ``executorch-*``
    backends of ``hfexport-executorch``) is pointed at that family's distribution; any other name gets no
    ``pip install`` line, since a distribution made up from a typo may not exist (or be someone else's).
    """
    eps = list(metadata.entry_points(group=GROUP))
    installed = sorted({ep.name for ep in eps})
    close = difflib.get_close_matches(name, installed, n=3, cutoff=0.6)
    message = f"unknown backend {name!r}."
    if close:
        message += f" Did you mean {' or '.join(map(repr, close))}?"
    message += (f" Installed backends: {', '.join(installed) or 'none'} (`hfexport backends` shows their "
                "status).")
    family = name.split("-")[0]
    members = [ep for ep in eps if ep.name.split("-")[0] == family and getattr(ep, "dist", None) is not None]
    # The family's own distribution (the one that ships the backend named like the family) when there is one.
    members = [ep for ep in members if ep.name == family] or members
    dists = sorted({ep.dist.metadata["Name"] for ep in members})
    if dists:
        message += (f" Backends named {family}-* come from {', '.join(dists)}: pip install --upgrade "
                    f"{' '.join(dists)} if a newer release adds {name!r}.")
    else:
        message += " A vendor's backend is installed as its own distribution (its documentation names it)."
    return message
