"""The patch context manager: install every patch of some scopes, restore the originals on exit."""

from __future__ import annotations

import contextlib
import importlib
import logging
import sys
import threading
import warnings
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any

from ._registry import Registration, workarounds_for

__all__ = ["PatchReport", "UnresolvedPatchWarning", "UnresolvedTarget", "check_patch_target", "is_user_registration",
           "patch_context", "resolve_path", "resolve_pattern"]

logger = logging.getLogger("hfexport")

# Patches are process-global (they replace attributes on modules and classes), so two exports in two
# threads would see each other's patches. One re-entrant lock serialises them; nesting in one thread is fine.
_PATCH_LOCK = threading.RLock()
_MISSING = object()
_DECLINED = object()


class UnresolvedTarget(LookupError):
    """A dotted path that does not name an attribute in the installed packages."""


class UnresolvedPatchWarning(UserWarning):
    """A workaround registered outside hfexport that is never applied: its target, wildcard or scope resolves
    to nothing (a typo, or a model or backend that is not installed)."""


def is_user_registration(registration: Registration) -> bool:
    """Whether ``registration`` comes from outside hfexport's own packages (``hfexport``, ``hfexport_*``).

    hfexport's own patches may target models the installed transformers lacks (skipped, reported in the
    manifest); a user's patch that resolves to nothing is almost always a mistake and gets a warning.
    """
    top = registration.module.split(".")[0]
    return not (top == "hfexport" or top.startswith("hfexport_"))


def resolve_path(path: str) -> tuple[Any, str]:
    """Resolve ``"pkg.module.Class.attr"`` to ``(owner, "attr")``, importing modules on the way.

    The longest importable module prefix is imported, then attributes are walked. Works for module
    functions (``"torch.where"``), methods (``"torch.Tensor.view"``) and nested classes.

    Raises:
        UnresolvedTarget: when no prefix imports or an attribute on the way is missing; the message says
            which part failed.
    """
    parts = path.split(".")
    if len(parts) < 2:
        raise UnresolvedTarget(f"{path!r} is not a dotted path")
    obj: Any = None
    index = 0
    for index in range(len(parts) - 1, 0, -1):
        module_name = ".".join(parts[:index])
        try:
            obj = importlib.import_module(module_name)
            break
        except ImportError:
            continue
        except Exception as exc:  # a module that raises on import is as good as missing, but say why
            raise UnresolvedTarget(f"importing {module_name!r} raised {type(exc).__name__}: {exc}") from exc
    else:
        raise UnresolvedTarget(f"no module in {path!r} can be imported (is {parts[0]!r} installed?)")
    for i in range(index, len(parts) - 1):
        try:
            obj = getattr(obj, parts[i])
        except AttributeError:
            where = ".".join(parts[:i])
            raise UnresolvedTarget(f"{where!r} has no attribute {parts[i]!r}") from None
    if not hasattr(obj, parts[-1]):
        raise UnresolvedTarget(f"{'.'.join(parts[:-1])!r} has no attribute {parts[-1]!r}")
    return obj, parts[-1]


def resolve_pattern(path: str) -> list[tuple[Any, str, str]]:
    """Resolve a wildcard path ``"module.pattern.ClassPattern.attr"`` against already-imported modules.

    The last two components are a class-name pattern and an attribute; everything before is a module-name
    pattern (``fnmatch`` syntax). Nothing is imported: a model-specific patch only matters for model
    classes whose module is loaded. Only classes that define ``attr`` themselves match (a subclass that
    inherits it is patched through its base).

    Returns:
        ``(owner_class, attr, concrete_path)`` for every match, sorted by path.
    """
    module_pattern, class_pattern, attr = path.rsplit(".", 2)
    matches = []
    for module_name, module in list(sys.modules.items()):
        if module is None or not fnmatchcase(module_name, module_pattern):
            continue
        for class_name, obj in list(vars(module).items()):
            if (isinstance(obj, type) and obj.__module__ == module_name and fnmatchcase(class_name, class_pattern)
                    and attr in vars(obj)):
                matches.append((obj, attr, f"{module_name}.{class_name}.{attr}"))
    return sorted(matches, key=lambda m: m[2])


@dataclass
class PatchReport:
    """What a :func:`patch_context` installed and what it skipped.

    Attributes:
        installed: ``(registration, path)`` pairs, in installation order.
        skipped: ``(registration, path, reason)`` for targets that did not resolve.
    """

    installed: list[tuple[Registration, str]] = field(default_factory=list)
    skipped: list[tuple[Registration, str, str]] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {
            "installed": [dict(r.as_dict(), path=p) for r, p in self.installed],
            "skipped": [dict(r.as_dict(), path=p, reason=why) for r, p, why in self.skipped],
        }


def _raw_attribute(owner: Any, attr: str) -> Any:
    """The attribute as stored on ``owner`` (a staticmethod stays a staticmethod), or _MISSING if inherited."""
    if isinstance(owner, type):
        return owner.__dict__.get(attr, _MISSING)
    return getattr(owner, attr)


def _install(owner: Any, attr: str, registration: Registration, ctx: Any = None) -> Any:
    """Install ``factory(original)`` (``factory(original, ctx=ctx)`` for a factory with a ``ctx`` parameter);
    returns the raw attribute to restore, or _DECLINED.

    A factory declines a target by returning ``original`` unchanged (e.g. a wildcard patch that applies
    only to some of the classes it matches).
    """
    raw = _raw_attribute(owner, attr)
    original = getattr(owner, attr)
    factory = registration.func
    replacement = factory(original, ctx=ctx) if registration.takes_context else factory(original)
    if replacement is original:  # the factory declined: this target does not need the patch
        return _DECLINED
    if isinstance(raw, staticmethod):
        replacement = staticmethod(replacement)
    elif isinstance(raw, classmethod):
        replacement = classmethod(replacement.__func__ if hasattr(replacement, "__func__") else replacement)
    setattr(owner, attr, replacement)
    return raw


def _restore(owner: Any, attr: str, raw: Any) -> None:
    if raw is _MISSING:
        delattr(owner, attr)  # it was inherited: remove our override so lookup finds the base class again
    else:
        setattr(owner, attr, raw)


@contextlib.contextmanager
def patch_context(scopes: Iterable[str], disabled: Iterable[str] = (), ctx: Any = None) -> Iterator[PatchReport]:
    """Install every patch registered for ``scopes``; restore all originals on exit, in reverse order.

    Targets that do not resolve (a model class that the installed transformers lacks) are skipped, logged
    and listed in the report. Two patches on one target are chained in registration order (the second
    wraps the first) and a warning names both. Originals are restored also when the body raises; nested
    and re-entrant use is safe, and concurrent exports in other threads wait for this one.

    Args:
        scopes: the scopes to install (``("dynamo", "onnx")``).
        disabled: function names of patches to leave out.
        ctx: the export's ``ExportContext``, given to factories that declare a ``ctx`` parameter (a hook that
            torch calls deep inside its own code reaches the export through it).

    Yields:
        A :class:`PatchReport`.
    """
    report = PatchReport()
    undo: list[tuple[Any, str, Any]] = []
    owners: dict[tuple[int, str], str] = {}
    ours: dict[int, Registration] = {}  # id(replacement) -> registration, for inherited targets
    with _PATCH_LOCK:
        try:
            for registration in workarounds_for("patch", scopes, disabled):
                user = is_user_registration(registration)
                for pattern in registration.paths:
                    if "*" in pattern:
                        targets = resolve_pattern(pattern)
                        if not targets and user:
                            _skip(report, registration, pattern, "the wildcard matches no class of a loaded "
                                  "module (is the model's module imported, and the pattern spelled right?)", user)
                    elif not user and _model_module_unloaded(pattern):
                        # No model of a module that was never imported is being exported: importing it here
                        # would only cost time and side effects (NLLB-MoE pulls in torchao and its warnings).
                        report.skipped.append((registration, pattern, "its model's module is not loaded"))
                        continue
                    else:
                        try:
                            targets = [(*resolve_path(pattern), pattern)]
                        except UnresolvedTarget as exc:
                            _skip(report, registration, pattern, str(exc), user)
                            continue
                    for owner, attr, path in targets:
                        _install_one(owner, attr, path, registration, report, undo, owners, ours, ctx)
            yield report
        finally:
            for owner, attr, raw in reversed(undo):
                _restore(owner, attr, raw)


def _model_module_unloaded(path: str) -> bool:
    """Whether ``path`` targets a Transformers model module (``transformers.models.<name>.<module>...``) that
    is not imported."""
    parts = path.split(".")
    return parts[:2] == ["transformers", "models"] and len(parts) > 4 and ".".join(parts[:4]) not in sys.modules


def _skip(report: PatchReport, registration: Registration, path: str, reason: str, user: bool) -> None:
    """Record a target that resolved to nothing: a warning for a user's patch, an INFO line for hfexport's own
    (which may target models the installed transformers lacks)."""
    report.skipped.append((registration, path, reason))
    if user:
        warnings.warn(f"patch {registration.qualified_name} is not applied to {path!r}: {reason}",
                      UnresolvedPatchWarning, stacklevel=4)
    else:
        logger.info("patch %s skipped: %s", registration.qualified_name, reason)


def check_patch_target(path: str, import_limit: int = 20) -> tuple[bool, str]:
    """Whether a patch path resolves, without installing anything: ``(ok, detail)``.

    A dotted path is resolved as :func:`patch_context` would (importing modules on the way). A wildcard is
    matched against loaded modules first; failing that, the module names its pattern can match are listed
    from the packages on disk (nothing imported), and up to ``import_limit`` of them are imported to look for
    the class and attribute.
    """
    if "*" not in path:
        try:
            resolve_path(path)
        except UnresolvedTarget as exc:
            return False, str(exc)
        return True, "resolves"
    matches = resolve_pattern(path)
    if matches:
        return True, f"matches {len(matches)} loaded class(es)"
    module_pattern = path.rsplit(".", 2)[0]
    modules = _modules_matching(module_pattern)
    if not modules:
        return False, f"no installed module matches {module_pattern!r}"
    if len(modules) > import_limit:
        return True, (f"{len(modules)} modules match {module_pattern!r}; classes are matched when a model's "
                      "module is loaded")
    for name in modules:
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001 - an unimportable module has no class to patch
            continue
    matches = resolve_pattern(path)
    if matches:
        return True, f"matches {len(matches)} class(es)"
    return False, f"no class in the {len(modules)} module(s) matching {module_pattern!r} defines the attribute"


def _modules_matching(pattern: str) -> list[str]:
    """Names of modules on disk that ``pattern`` (``fnmatch`` per dotted part) matches; imports only the
    packages of the pattern's literal prefix."""
    import pkgutil

    parts = pattern.split(".")
    literal = next((i for i, p in enumerate(parts) if any(c in p for c in "*?[")), len(parts))
    if literal == 0:
        return []
    prefix = ".".join(parts[:literal])
    try:
        module = importlib.import_module(prefix)
    except Exception:  # noqa: BLE001 - not installed or broken: nothing matches
        return []
    if literal == len(parts):
        return [prefix]
    level = [(prefix, getattr(module, "__path__", None))]
    for i, part in enumerate(parts[literal:], start=literal):
        last = i == len(parts) - 1
        found = []
        for name, paths in level:
            if paths is None:
                continue
            for info in pkgutil.iter_modules(paths):
                if fnmatchcase(info.name, part) and (last or info.ispkg):
                    child = f"{name}.{info.name}"
                    sub = [str(Path(p) / info.name) for p in paths] if info.ispkg else None
                    found.append((child, sub))
        level = found
    return sorted(name for name, _ in level)


def _install_one(owner: Any, attr: str, path: str, registration: Registration, report: PatchReport,
                 undo: list[tuple[Any, str, Any]], owners: dict[tuple[int, str], str],
                 ours: dict[int, Registration], ctx: Any = None) -> None:
    current = getattr(owner, attr)
    if ours.get(id(current)) is registration and _raw_attribute(owner, attr) is _MISSING:
        # A subclass that inherits the method this factory already replaced on its base: wrapping it
        # again would apply the patch twice.
        report.installed.append((registration, path))
        return
    raw = _install(owner, attr, registration, ctx)
    if raw is _DECLINED:
        return
    key = (id(owner), attr)
    if key in owners:
        logger.warning("two patches on %s: %s wraps %s", path, registration.qualified_name, owners[key])
    owners[key] = registration.qualified_name
    undo.append((owner, attr, raw))
    ours[id(getattr(owner, attr))] = registration
    report.installed.append((registration, path))
    logger.info("patch %s installed on %s", registration.qualified_name, path)
