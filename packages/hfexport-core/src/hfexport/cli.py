"""The ``hfexport`` command line: export, list backends, stages and workarounds.

Kept light: ``hfexport --help`` and ``hfexport backends`` import neither torch nor any toolchain.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from importlib import metadata
from pathlib import Path
from typing import Any

EPILOG = """\
examples:
  hfexport export --demo                                  export the bundled all-MiniLM-L6-v2 (dynamo, dynamic)
  hfexport export --demo --backend onnx                   ... to ONNX, verified on ONNX Runtime
  hfexport export ./my-model --backend executorch-xnnpack --output out/ --dynamic
  hfexport backends                                       what is installed (name, distribution, version, status)
  hfexport stages onnx                                    the stages of a backend and their extension points
  hfexport workarounds --scope onnx                       the registered patches and fixes

Every export is saved atomically (export.json manifest + program files), loaded back from disk, and run on
the backend's runtime against eager PyTorch; the max abs difference of every output is printed.
Exit status: 0 ok, 1 verification failed, 2 bad usage or export error.
"""


def _console() -> Any:
    from rich.console import Console

    return Console(stderr=True, highlight=False, soft_wrap=True)


class _Progress:
    """One line per stage on a TTY (✅/❌ with seconds); silent when piped. Keeps the lines for --report."""

    def __init__(self, console: Any):
        self.console = console
        self.enabled = console.is_terminal
        self._status: Any = None
        self.lines: list[str] = []

    def __call__(self, event: Any) -> None:
        if event.step:  # a toolchain call inside a stage: one indented line when it ends
            if event.status != "start" and self.enabled:
                mark = "✅" if event.status == "done" else "❌"
                self.console.print(f"{'    ' * event.depth}→ {event.step} {mark} {event.seconds:.2f}s")
            return
        if event.status != "start":
            mark = "✅" if event.status == "done" else "❌"
            self.lines.append(f"| {event.backend} | {'  ' * event.depth}{event.stage.number}/{event.total} "
                              f"{event.stage.title} | {mark} | {event.seconds:.2f} |")
        if not self.enabled:
            return
        indent = "    " * event.depth
        label = f"{indent}[{event.backend} {event.stage.number}/{event.total}] {event.stage.title}"
        if event.stage.runs:
            label += f" → {event.stage.runs}"
        if event.status == "start":
            if self._status is None:
                self._status = self.console.status(label)
                self._status.start()
            else:
                self._status.update(label)
            return
        mark = "✅" if event.status == "done" else "❌"
        self.console.print(f"{label} {mark} {event.seconds:.2f}s")

    def stop(self) -> None:
        if self._status is not None:
            self._status.stop()
            self._status = None


def _cmd_backends(args: argparse.Namespace) -> int:
    from ._discovery import list_backends

    infos = list_backends(load=not args.no_load)
    if args.json:
        print(json.dumps([{"name": i.name, "distribution": i.distribution, "version": i.version,
                           "status": i.status, "error": i.error, "entry_point": i.value} for i in infos], indent=2))
        return 0
    rows = [("name", "distribution", "version", "status")]
    rows += [(i.name, i.distribution, i.version, i.status + (f": {i.error}" if i.error else "")) for i in infos]
    widths = [max(len(r[c]) for r in rows[:]) for c in range(3)]
    for r in rows:
        print(f"{r[0]:<{widths[0]}}  {r[1]:<{widths[1]}}  {r[2]:<{widths[2]}}  {r[3]}")
    return 0


def _cmd_stages(args: argparse.Namespace) -> int:
    from ._discovery import get_backend

    exporter = get_backend(args.backend).load_exporter()
    for stage in exporter.describe_stages():
        runs = f"  (runs {stage['runs']})" if stage["runs"] else ""
        print(f"{stage['number']}. {stage['title']:<26} extension point: {stage['extension_point']}{runs}")
    return 0


def _cmd_workarounds(args: argparse.Namespace) -> int:
    from ._discovery import list_backends
    from ._registry import list_workarounds

    for info in list_backends():  # import every backend's exporter so that its registrations exist
        if info.status == "ok" and info.backend is not None:
            try:
                info.backend.load_exporter()
            except Exception as exc:  # listed, not fatal
                print(f"# {info.name}: {exc}", file=sys.stderr)
    for r in list_workarounds(args.scope, args.kind):
        target = f" -> {', '.join(r.paths)}" if r.paths else ""
        target += "".join(f" ({k}={v})" for k, v in r.data.items())
        print(f"{r.scope:<20} {r.kind:<15} {r.qualified_name}{target}\n{'':<37}{r.summary}")
    return 0


def _check_output(path: Path, overwrite: bool) -> None:
    if path.exists() and (not path.is_dir() or any(path.iterdir())) and not overwrite:
        raise SystemExit(f"error: output directory {path} exists and is not empty; pass --overwrite to replace "
                         "it, or choose another --output")
    from ._artifact import MANIFEST_NAME

    if overwrite and path.is_dir() and any(path.iterdir()) and not (path / MANIFEST_NAME).is_file():
        raise SystemExit(f"error: --overwrite replaces only an earlier export, and {path} is not one (it has no "
                         f"{MANIFEST_NAME}); choose another --output, or empty the directory yourself")


def _cmd_export(args: argparse.Namespace) -> int:
    console = _console()
    demo = getattr(args, "demo", None)  # a loader, when a command plugin contributes --demo
    if not demo and not args.model:
        console.print("error: give a model directory (or --demo where a plugin provides one, e.g. hfexport-dynamo; "
                      "see `hfexport export --help`)")
        return 2
    from ._discovery import UnknownBackendError, get_backend

    # torchao (imported by transformers when installed, e.g. as an executorch dependency) registers Enum
    # constants as pytree nodes, and torch logs a deprecation warning for each on every run: nothing the
    # user of this command can act on. Errors from that logger still show.
    logging.getLogger("torch.utils._pytree").setLevel(logging.ERROR)
    try:
        exporter_class = get_backend(args.backend).load_exporter()
    except (UnknownBackendError, ImportError, TypeError) as exc:
        console.print(f"error: {exc}")
        return 2
    output = Path(args.output or f"out/{args.backend}")
    _check_output(output, args.overwrite)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")

    from ._stages import ExportError

    start = time.perf_counter()
    if demo:
        model, inputs, check_inputs, source = demo()
    else:
        model = exporter_class.load_model(args.model)
        inputs, check_inputs = None, None
        source = str(args.model)
    dynamic = args.dynamic or bool(demo)
    console.print(f"exporting {type(model).__name__} from {source} with backend {args.backend!r}"
                  f"{' (dynamic shapes)' if dynamic else ''}")
    progress = _Progress(console)
    try:
        exported = exporter_class(dynamic=dynamic).export(model, inputs, progress=progress)
    except ExportError as exc:
        progress.stop()
        console.print(f"[red]error:[/red] {exc}")
        if args.traceback:
            raise
        console.print("(run again with --traceback for the full chained traceback)")
        return 2
    finally:
        progress.stop()
    path = exported.save_pretrained(output, overwrite=args.overwrite)
    console.print(f"saved to {path} ({', '.join(exported.manifest['files'])}) in {time.perf_counter() - start:.1f}s")
    if args.no_verify:
        return 0
    from ._api import load

    reloaded = load(path)
    if check_inputs is None:
        check_inputs = exporter_class.sample_inputs(model, reloaded.manifest)
    if check_inputs is None:
        console.print("this backend gives no sample inputs for verification: skipped (use the Python API)")
        return 0
    shapes = ", ".join(f"{k}={list(v.shape)}" for k, v in check_inputs.items() if hasattr(v, "shape"))
    console.print(f"verifying the artifact loaded back from disk at {shapes}")
    report = reloaded.verify(check_inputs, atol=args.atol, rtol=args.rtol, reference=model)
    from ._artifact import MANIFEST_NAME
    from ._saving import update_manifest

    # The saved export.json keeps the report of the check of the files on disk (written atomically).
    exported.manifest = update_manifest(path, MANIFEST_NAME, {"verification": reloaded.manifest["verification"]})
    print(report)
    if args.report:
        _write_report(Path(args.report), args, exported, progress.lines, report, shapes)
    return 0 if report.passed else 1


def _write_report(path: Path, args: argparse.Namespace, exported: Any, stage_lines: list[str], report: Any,
                  shapes: str) -> None:
    """The export as markdown: stages with seconds, workarounds applied, verification."""
    m = exported.manifest
    lines = [f"# hfexport: {m['model_class']} -> {m['backend']}", "",
             f"- artifact: `{args.output or 'out/' + args.backend}` ({', '.join(m.get('files', []))})",
             f"- versions: {', '.join(f'{k} {v}' for k, v in m.get('versions', {}).items())}", "",
             "| backend | stage | | seconds |", "|---|---|---|---|", *stage_lines, "",
             "## Workarounds installed (patches) and applied (fixes)", ""]
    lines += [f"- patch `{p['name']}` on `{p['path']}`: {p['summary']}" for p in m["workarounds"]["patches"]]
    lines += [f"- fix `{name}` x{count}" for name, count in m["workarounds"]["fixes"].items()]
    lines += ["", f"## Verification at {shapes}", "", "```", str(report), "```", ""]
    path.write_text("\n".join(lines))


def build_parser() -> argparse.ArgumentParser:
    try:
        version = metadata.version("hfexport-core")
    except metadata.PackageNotFoundError:  # pragma: no cover
        version = "unknown"
    parser = argparse.ArgumentParser(
        prog="hfexport", formatter_class=argparse.RawDescriptionHelpFormatter, epilog=EPILOG,
        description="Export Hugging Face Transformers models through torch.export to .pt2, ONNX or ExecuTorch, "
                    "and verify every export on its runtime against eager PyTorch.")
    parser.add_argument("--version", action="version", version=f"hfexport {version}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    p = sub.add_parser("export", help="export a model directory (or the demo model), save it and verify it",
                       formatter_class=argparse.RawDescriptionHelpFormatter, epilog=EPILOG)
    p.add_argument("model", nargs="?", help="a local Transformers model directory (config.json + weights)")
    p.add_argument("--backend", "-b", default="dynamo", help="backend name, see `hfexport backends` (default: dynamo)")
    p.add_argument("--output", "-o", help="artifact directory (default: out/<backend>)")
    p.add_argument("--dynamic", action="store_true", help="dynamic batch and sequence dims (Dim.AUTO on every dim)")
    p.add_argument("--no-verify", action="store_true", help="skip running the saved artifact against eager")
    p.add_argument("--overwrite", action="store_true", help="replace a non-empty output directory")
    p.add_argument("--atol", type=float, default=1e-4, help="absolute tolerance of the verification (default 1e-4)")
    p.add_argument("--rtol", type=float, default=1e-4, help="relative tolerance of the verification (default 1e-4)")
    p.add_argument("--traceback", action="store_true", help="show the full traceback of a failed export")
    p.add_argument("--report", metavar="FILE", help="also write the stages, workarounds and verification as markdown")
    p.set_defaults(func=_cmd_export, demo=None)

    p = sub.add_parser("backends", help="list installed backends: name, distribution, version, status")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--no-load", action="store_true", help="read entry point metadata only (no plugin import)")
    p.set_defaults(func=_cmd_backends)

    p = sub.add_parser("stages", help="list a backend's stages and their extension points")
    p.add_argument("backend")
    p.set_defaults(func=_cmd_stages)

    p = sub.add_parser("workarounds", help="list registered patches and FX fixes (with where they come from)")
    p.add_argument("--scope", help="only this scope (dynamo, onnx, executorch, executorch.cuda, ...)")
    p.add_argument("--kind", help="only this kind (patch, fx_node_fix, fx_program_fix, onnx_translation, ...)")
    p.set_defaults(func=_cmd_workarounds)

    # Commands contributed by plugins: ``register(subparsers)`` adds a subcommand, or options to one
    # (hfexport-dynamo adds ``export --demo``).
    for ep in metadata.entry_points(group="hfexport.commands"):
        try:
            ep.load()(sub)
        except Exception as exc:
            print(f"warning: command plugin {ep.name} ({ep.value}) failed to load: {exc}", file=sys.stderr)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
