"""The ``hfexport`` commands that inspect what is installed or saved: ``backends`` (name, distribution, toolchain,
status), ``stages`` (a backend's documented stages and steps, read from its source), ``workarounds`` (from the
backends' workaround indexes, or the live registry with ``--import``/``--check``) and ``verify`` (a saved artifact:
manifest, paths, hashes, loading, a run). Kept light: none imports torch or a toolchain to parse its arguments.
"""

from __future__ import annotations

import argparse
import difflib
import json
import os
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

from .commands import (
    EXIT_ERROR,
    EXIT_OK,
    UsageError,
    quiet_third_party_logs,
    resolve_artifact,
)


def _cmd_backends(args: argparse.Namespace) -> int:
    from ._discovery import list_backends

    infos = list_backends(load=not args.no_load)
    if args.json:
        print(json.dumps([{"name": i.name, "distribution": i.distribution, "version": i.version,
                           "toolchain": _toolchain(i),
                           "status": i.status, "error": i.error, "note": i.note, "entry_point": i.value}
                          for i in infos], indent=2))
        return 0
    rows = [("name", "distribution", "dist version", "toolchain", "status")]
    rows += [(i.name, i.distribution, i.version, _toolchain(i), i.status + (f": {i.error}" if i.error else "")
              + (f" ({i.note})" if i.note else "")) for i in infos]
    widths = [max(len(r[c]) for r in rows) for c in range(4)]
    for r in rows:
        print("  ".join(f"{cell:<{width}}" for cell, width in zip(r[:4], widths, strict=True)) + f"  {r[4]}")
    return 0


def _toolchain(info: Any) -> str:
    """The toolchain a backend lowers with and its installed version (``openvino 2025.3.0``): the last of its
    declared requirements other than transformers (torch for dynamo), read from the installed distributions'
    metadata; ``-`` unknown (``--no-load``)."""
    requires = getattr(info.backend, "requires", None) or ()
    if not requires:
        return "-"
    name = next((r for r in reversed(requires) if r != "transformers"), requires[-1])
    try:
        return f"{name} {metadata.version(name)}"
    except metadata.PackageNotFoundError:
        return f"{name} (missing)"
    return 0


def _cmd_stages(args: argparse.Namespace) -> int:
    from ._discovery import get_backend
    from ._stage_source import stages_from_source

    backend = get_backend(args.backend)
    # read from the exporter's source (no toolchain import); imported only when the source does not say
    stages = stages_from_source(backend.exporter) or backend.load_exporter().describe_stages()
    print(f"{args.backend}: the documented stages (where you extend an export), and in running order between them the "
          "steps (→, the toolchain call each runs)")
    for item in stages:
        if "step" in item:
            print(f"   → {item['step']:<24} runs {item['runs']}")
        else:
            print(f"{item['number']}. {item['title']:<26} extension point: {item['extension_point']}")
    return 0


def _cmd_verify(args: argparse.Namespace) -> int:
    from ._hub import is_hub_reference
    from ._verify import verify_artifact

    artifact = resolve_artifact(args.artifact, args.revision, args.subfolder)
    if is_hub_reference(args.artifact):  # org/name: export.json, then only the files it names, into the HF cache
        print(f"·  hub       {args.artifact}: export.json and the files it names, in {artifact}")
    if not Path(artifact).is_dir():
        raise UsageError(f"{artifact} is not a directory: give the directory of a saved export (it holds "
                         "export.json), or a Hub repository id (org/name)")
    if args.model is not None and not Path(args.model).is_dir():
        raise UsageError(f"--model {args.model} is not a directory: give the exported model's directory")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    quiet_third_party_logs()
    return verify_artifact(artifact, model=args.model, atol=args.atol, rtol=args.rtol,
                           trust_remote_code=args.trust_remote_code, run=not args.no_run)


def _cmd_workarounds(args: argparse.Namespace) -> int:
    if args.imports or args.check:  # the user's modules, or resolving targets: the live registry
        return _workarounds_imported(args)
    from .workaround_index import indexed_workarounds

    # each backend distribution's workaround_index.json, no torch or toolchain import (one without: imported)
    listed, scopes, errors = indexed_workarounds()
    for error in errors:
        print(f"# {error}", file=sys.stderr)
    _check_known("--scope", args.scope, scopes | {r.scope for r in listed})
    _check_known("--kind", args.kind, {r.kind for r in listed})
    for r in listed:
        if (args.scope is None or r.scope == args.scope) and (args.kind is None or r.kind == args.kind):
            _print_workaround(r)
    return EXIT_OK


def _check_known(flag: str, value: str | None, known: set[str]) -> None:
    if value is not None and value not in known:  # a typo lists nothing: say so, before printing nothing
        close = difflib.get_close_matches(value, sorted(known), n=1)
        raise UsageError(f"{flag} {value!r} names no registered workaround"
                         + (f" (did you mean {close[0]!r}?)" if close else "")
                         + f"; the {flag[2:]}s known here: {', '.join(sorted(known))}")


def _print_workaround(r: Any) -> None:
    target = f" -> {', '.join(r.paths)}" if r.paths else ""
    target += "".join(f" ({k}={v})" for k, v in r.data.items())
    print(f"{r.scope:<20} {r.kind:<15} {r.qualified_name}{target}\n{'':<37}{r.summary}")


def _workarounds_imported(args: argparse.Namespace) -> int:
    """``hfexport workarounds`` from the live registry: every backend's exporter imported (with ``--import`` or
    ``--check``)."""
    import importlib

    from ._discovery import list_backends
    from ._registry import list_workarounds

    for module in args.imports or ():  # the user's own registrations
        try:
            importlib.import_module(module)
        except ImportError as exc:
            raise UsageError(f"--import {module}: {exc} (give an importable module name, e.g. my_patches)") from exc
    scopes: set[str] = set()  # those the backends activate, with workarounds or not (executorch.cuda)
    for info in list_backends():  # import every backend's exporter so that its registrations exist
        if info.status == "ok" and info.backend is not None:
            try:
                scopes.update(info.backend.load_exporter().scopes)
            except Exception as exc:  # listed, not fatal
                print(f"# {info.name}: {exc}", file=sys.stderr)
    everything = list_workarounds()
    _check_known("--scope", args.scope, scopes | {r.scope for r in everything})
    _check_known("--kind", args.kind, {r.kind for r in everything})
    unresolved = 0
    for r in list_workarounds(args.scope, args.kind):
        _print_workaround(r)
        if args.check:
            for problem in _unresolved(r):
                unresolved += 1
                print(f"{'':<37}UNRESOLVED {problem}")
    if args.check:
        print(f"{unresolved} unresolved target(s) or scope(s)" if unresolved else "every target and scope resolves",
              file=sys.stderr)
    return EXIT_ERROR if unresolved else EXIT_OK


def _unresolved(registration: Any) -> list[str]:
    """What of ``registration`` resolves to nothing: its scope, each patch path (resolved, not installed)."""
    from ._exporter import unresolved_scope
    from ._patching import check_patch_target

    problems = []
    why = unresolved_scope(registration.scope)
    if why:
        problems.append(f"scope: {why}")
    for path in registration.paths:
        ok, detail = check_patch_target(path)
        if not ok:
            problems.append(f"{path}: {detail}")
    return problems
