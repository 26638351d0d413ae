"""The ``hfexport`` command line: export, verify a saved artifact, list backends, stages and workarounds.

Kept light: ``hfexport --help`` and ``hfexport backends`` import neither torch nor any toolchain.
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
import json
import logging
import os
import sys
import time
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path
from typing import Any

from .commands import (
    DTYPES,
    EXIT_ERROR,
    EXIT_MISMATCH,
    EXIT_OK,
    EXIT_USAGE,
    VERBOSE_ENV,
    Progress,
    UsageError,
    configured_exporter,
    console,
    load_model,
    model_summary,
    quiet_third_party_logs,
    record_verification,
    resolve_artifact,
    say,
    timed,
    verbose,
    write_report,
)

# The recipes of ``--quantize`` per backend, for its help (kept light: no backend imported); the tests check them
# against each backend's recipe table.
QUANTIZE_RECIPES = {
    "onnx": ("int8-dynamic", "int4", "int8-dynamic-per-tensor", "int8-static"),
    "executorch-xnnpack": ("8da4w", "8da8w", "int8", "int8-dynamic"),
    "openvino": ("int8-weights", "int4-weights"),
}

EPILOG = """\
examples:
  hfexport export --demo                                  export the bundled all-MiniLM-L6-v2 (dynamo, dynamic)
  hfexport export --demo --backend onnx                   ... to ONNX, verified on ONNX Runtime
  hfexport export ./my-model --backend executorch-xnnpack --output out/ --dynamic
  hfexport backends                                       what is installed (name, distribution, version, status)
  hfexport stages onnx                                    the stages of a backend and their extension points
  hfexport workarounds --scope onnx                       the registered patches and fixes
  hfexport workarounds --check --import my_patches        ... and which targets resolve to nothing
  hfexport verify out/dynamo --model ./my-model           check a saved artifact (hashes, paths) and re-run it
  hfexport verify org/name --subfolder hfexport/dynamo    ... one on the Hub (fetches only the files it names)
  hfexport export ./my-llm --task text-generation --max-cache-len 128 -o out/gen
                                                          one decoder program, checked by generation
  hfexport export org/my-llm --backend openvino --quantize int4-weights --group-size 64 --sym
                                                          a Hub id; a *ForCausalLM exports for text-generation
  hfexport generate out/gen --input-ids 1,306,4966 --max-new-tokens 20
  hfexport generate out/gen --prompt "Hello" --tokenizer ./my-llm --max-new-tokens 20

Every export is saved atomically (export.json manifest + program files), loaded back from disk, and run on
the backend's runtime against eager PyTorch; the max abs difference of every output is printed (with
--task: the token ids of greedy generation are compared with eager model.generate(do_sample=False)).
Errors print one line (--debug shows the traceback).
Exit status: 0 ok, 1 export error (or any other failure), 2 bad usage (unknown backend, task or option, a
missing model directory, an output directory that is not empty), 3 verification mismatch (the artifact's
outputs differ from eager PyTorch beyond --atol/--rtol, or its generated token ids differ).
"""









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


def _check_writable(path: Path) -> None:
    """Refuse, before any model loads, an output directory that cannot be written: the nearest existing directory
    above ``path`` (where the save makes the missing directories, its lock and its staging folder) must take a new
    file (a probe file is made and removed: permissions, a read-only file system, a file in the way)."""
    import tempfile

    ancestor = path.absolute().parent
    while not ancestor.exists() and ancestor != ancestor.parent:
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise UsageError(f"output directory {path} cannot be made: {ancestor} is a file, not a directory; choose "
                         "another --output")
    try:
        fd, probe = tempfile.mkstemp(prefix=".hfexport-write-check-", dir=ancestor)
    except OSError as exc:
        raise UsageError(f"output directory {path} cannot be written: {ancestor} refuses new files "
                         f"({exc.strerror or exc}); choose another --output (a directory you can write)") from None
    os.close(fd)
    os.unlink(probe)


def _check_output(path: Path, overwrite: bool) -> None:
    _check_writable(path)
    if path.exists() and (not path.is_dir() or any(path.iterdir())) and not overwrite:
        raise UsageError(f"output directory {path} exists and is not empty; pass --overwrite to replace "
                         "it, or choose another --output")
    from ._artifact import MANIFEST_NAME

    if overwrite and path.is_dir() and any(path.iterdir()) and not (path / MANIFEST_NAME).is_file():
        raise UsageError(f"--overwrite replaces only an earlier export, and {path} is not one (it has no "
                         f"{MANIFEST_NAME}); choose another --output, or empty the directory yourself")


# The weight files Transformers' from_pretrained reads from a local directory (one of them, or a sharded index).
_WEIGHT_PATTERNS = ("*.safetensors", "*.safetensors.index.json", "pytorch_model*.bin", "pytorch_model.bin.index.json",
                    "tf_model.h5", "flax_model.msgpack", "model.ckpt.index")


def _check_weights(directory: Path) -> None:
    """Refuse, before any model loads, a model directory with ``config.json`` and no weight file (a download that
    stopped early, a config copied alone): ``from_pretrained`` would fail after the imports, or build random weights."""
    if not any(next(directory.glob(pattern), None) is not None for pattern in _WEIGHT_PATTERNS):
        raise UsageError(f"{directory} has config.json but no weights (model.safetensors, pytorch_model.bin or a "
                         "sharded *.index.json): give the directory model.save_pretrained(path) wrote, with its "
                         "weight files")


# --dtype's default verification tolerances (atol and rtol): a few roundings of the dtype (eps: fp16 9.8e-4, bf16
# 7.8e-3); a seeded tiny Llama's bf16 logits differ from bf16 eager by 2e-3 on dynamo.
_HALF_TOLERANCE = {"fp16": 1e-2, "bf16": 5e-2}


def _download_model(repo_id: str, revision: str | None, trust_remote_code: bool) -> Path:
    """The local snapshot of Hub model ``repo_id`` (config, safetensors weights, tokenizer and processor files; the
    model's own code with ``trust_remote_code``), through ``huggingface_hub`` into its cache; ``HF_HUB_OFFLINE=1``
    reads the cache alone.

    Raises:
        UsageError: no such repository or revision, or nothing cached offline (the message says which).
    """
    from huggingface_hub import constants, snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError, RepositoryNotFoundError, RevisionNotFoundError

    patterns = ["*.json", "*.safetensors", "*.model", "*.txt", "*.jinja", "*.tiktoken"]
    if trust_remote_code:
        patterns.append("*.py")
    try:
        return Path(snapshot_download(repo_id, revision=revision, allow_patterns=patterns))
    except RepositoryNotFoundError:
        raise UsageError(f"{repo_id} is neither a local directory nor a Hub model you can read (a typo? private or "
                         "gated: log in with `hf auth login`)") from None
    except RevisionNotFoundError:
        raise UsageError(f"Hub model {repo_id} has no revision {revision!r}") from None
    except LocalEntryNotFoundError:
        why = "HF_HUB_OFFLINE is set" if constants.HF_HUB_OFFLINE else "the Hub could not be reached"
        raise UsageError(f"{repo_id} is not a local directory, {why}, and the Hugging Face cache "
                         f"({constants.HF_HUB_CACHE}) holds no snapshot of it: download it once online, or give "
                         "the model's directory") from None


def _infer_task(args: argparse.Namespace, backend: Any) -> str | None:
    """``"text-generation"`` for a model directory whose config.json names a ``*ForCausalLM`` when the backend
    exports that task and nothing asks for one forward pass (``--no-task``, ``--dynamic``); else None."""
    if getattr(args, "no_task", False) or args.dynamic or "text-generation" not in (backend.tasks or ()):
        return None
    architecture = model_summary(args.model)
    if architecture.endswith("ForCausalLM"):
        args.task = "text-generation"
        return "text-generation"
    return None


def _check_remote_code(directory: Path, trust_remote_code: bool) -> None:
    """Refuse, before any import, a model whose code lives in its repository (config.json's ``auto_map``) without
    ``--trust-remote-code``: loading it runs that code."""
    import json

    try:
        config = json.loads((directory / "config.json").read_text())
    except (OSError, ValueError):
        return
    if isinstance(config, dict) and config.get("auto_map") and not trust_remote_code:
        classes = ", ".join(sorted(str(v) for v in config["auto_map"].values()))[:200]
        raise UsageError(f"{directory}'s config.json maps its classes to code in the model's repository (auto_map: "
                         f"{classes}): loading it runs that code; pass --trust-remote-code if you trust its source")


def _check_report(report: str | None) -> None:
    """``--report FILE`` is writable where it points: its directory exists and it is not a directory itself."""
    if not report:
        return
    path = Path(report)
    if path.is_dir():
        raise UsageError(f"--report {report} is a directory: give a file name, e.g. --report {path / 'report.md'}")
    if not path.parent.is_dir():
        raise UsageError(f"--report {report}: directory {path.parent} does not exist; create it first or give "
                         "another path")


class _BackendOptions:
    """An exporter class whose instances get the config options that command plugins add to ``export`` (hfexport-onnx:
    ``--no-ort-fusions``); class attributes and methods are the class's own."""

    def __init__(self, exporter_class: Any, options: dict[str, Any]):
        self._exporter_class, self._options = exporter_class, options

    def __getattr__(self, name: str) -> Any:
        return getattr(self._exporter_class, name)

    def __call__(self, *args: Any, **options: Any) -> Any:
        return self._exporter_class(*args, **{**self._options, **options})


def _with_backend_options(exporter_class: Any, args: argparse.Namespace) -> Any:
    """``exporter_class`` with the options plugins collect in ``args.backend_options``; one the backend does not take
    is a usage error."""
    options = dict(getattr(args, "backend_options", None) or {})
    if not options:
        return exporter_class
    try:
        exporter_class.config_class.from_options(**options)
    except (TypeError, ValueError) as exc:
        raise UsageError(f"backend {args.backend!r} does not take the option {', '.join(options)} ({exc})") from exc
    return _BackendOptions(exporter_class, options)


def _cmd_export(args: argparse.Namespace) -> int:
    out = console()
    demo = getattr(args, "demo", None)  # a loader, when a command plugin contributes --demo
    if demo and args.model:
        raise UsageError(f"give a model directory or --demo, not both (got {args.model!r} and --demo)")
    if not demo and not args.model:
        raise UsageError("give a model directory (or --demo where a plugin provides one, e.g. hfexport-dynamo; "
                         "see `hfexport export --help`)")
    hub = None
    if not demo and not Path(args.model).is_dir():
        from ._hub import is_hub_reference

        if not is_hub_reference(args.model):
            raise UsageError(f"model directory {args.model} does not exist (a local Transformers model directory: "
                             "config.json + weights, or a Hub model id org/name)")
        hub = args.model
        print(f"exporting {hub} from the Hugging Face Hub with backend {args.backend!r} to "
              f"{args.output or f'out/{args.backend}'}", file=sys.stderr, flush=True)
        with timed(f"fetching {hub}'s config, weights and tokenizer (huggingface_hub, into its cache)"):
            args.model = str(_download_model(hub, getattr(args, "revision", None), args.trust_remote_code))
    elif getattr(args, "revision", None) is not None:
        raise UsageError(f"--revision is for a Hub model id (org/name); {args.model or '--demo'} is local")
    if not demo and not (Path(args.model) / "config.json").is_file():
        raise UsageError(f"{args.model} has no config.json: give a Transformers model directory (config.json + "
                         "weights), e.g. one written by model.save_pretrained(path)")
    task = getattr(args, "task", None)  # --task and its bounds come from a command plugin (hfexport-dynamo)
    from ._discovery import UnknownBackendError, get_backend

    try:
        backend = get_backend(args.backend)
    except (UnknownBackendError, TypeError) as exc:
        raise UsageError(str(exc)) from exc
    inferred = None
    if task is None and not demo:
        task = inferred = _infer_task(args, backend)
    if not demo:
        _check_remote_code(Path(args.model), args.trust_remote_code)
    if task is not None and backend.tasks and task not in backend.tasks:  # before any model or toolchain loads
        close = difflib.get_close_matches(task, backend.tasks, n=1, cutoff=0.8)
        raise UsageError(f"unknown task {task!r}" + (f" (did you mean {close[0]!r}?)" if close else "")
                         + f"; backend {args.backend!r} exports the tasks {', '.join(backend.tasks)}, and a "
                         "single forward pass (feature extraction, classification, ...) without --task")
    if getattr(args, "check_task_options", None) is not None:
        args.check_task_options(args, task, demo)

    dtype = getattr(args, "dtype", None)
    if dtype in _HALF_TOLERANCE:  # a half-precision export differs from half eager by its rounding, not 1e-4
        args.atol = _HALF_TOLERANCE[dtype] if args.atol is None else args.atol
        args.rtol = _HALF_TOLERANCE[dtype] if args.rtol is None else args.rtol
    quiet_third_party_logs()
    from ._artifact import MANIFEST_NAME

    output = Path(args.output or f"out/{args.backend}")
    if demo and args.output is None and (output / MANIFEST_NAME).is_file():
        args.overwrite = True  # the demo's own directory: running the README's first command again replaces it
    if not demo:
        _check_weights(Path(args.model))  # the arguments first (a mistyped task), then the files
    _check_output(output, args.overwrite)  # before the toolchain loads
    _check_report(args.report)
    # the first line: what, from where, to where, with which backend (before the toolchain and the model load)
    what = "the demo model" if demo else f"{model_summary(args.model)} from {hub or args.model}"
    out.print(f"exporting {what} with backend {args.backend!r}{f' for task {task!r}' if task else ''} to {output}",
              markup=False)
    if inferred:
        out.print(f"task {inferred!r} inferred from {model_summary(args.model)} (config.json's architectures): pass "
                  "--no-task to export one forward pass instead, or --task to choose another", markup=False)
    try:
        with timed(f"importing the {args.backend} backend and its toolchain"):
            exporter_class = backend.load_exporter()
    except (UnknownBackendError, ImportError, TypeError) as exc:
        raise UsageError(str(exc)) from exc
    exporter_class = _with_backend_options(exporter_class, args)
    configured_exporter(exporter_class, args)  # a --quantize recipe the backend refuses: before any model loads
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if task is not None:
        return args.export_task(args, exporter_class, output, out)

    from ._stages import ExportError

    start = time.perf_counter()
    with timed("loading the model"):
        if demo:
            model, inputs, check_inputs, source = demo()
        else:
            model = load_model(exporter_class, args)
            inputs, check_inputs = None, None
            source = str(args.model)
    dynamic = args.dynamic or bool(demo)
    say(f"exporting {type(model).__name__} from {source}{' with dynamic shapes' if dynamic else ''}")
    progress = Progress(out)
    try:  # verified on the traced inputs (a mismatch exits 3; --no-verify records it in export.json instead)
        exported = configured_exporter(exporter_class, args, dynamic=dynamic).export(
            model, inputs, progress=progress, verify=not args.no_verify, atol=args.atol, rtol=args.rtol)
    except ExportError:
        progress.stop()
        raise  # main() prints it on one line (the traceback with --debug) and exits 1
    finally:
        progress.stop()
    with timed(f"saving to {output}"):
        path = exported.save_pretrained(output, overwrite=args.overwrite)
    out.print(f"saved to {path} ({', '.join(exported.manifest['files'])}) in {time.perf_counter() - start:.1f}s",
              markup=False)
    if args.no_verify:
        return 0
    from ._api import load

    with timed("loading the artifact back from disk"):
        reloaded = load(path)
    if check_inputs is None:
        check_inputs = exporter_class.sample_inputs(model, reloaded.manifest)
    if check_inputs is None:
        out.print("this backend gives no sample inputs for verification: skipped (use the Python API)")
        return 0
    shapes = ", ".join(f"{k}={list(v.shape)}" for k, v in check_inputs.items() if hasattr(v, "shape"))
    out.print(f"verifying the artifact loaded back from disk at {shapes}", markup=False)
    recorded = reloaded.manifest.get("verification") or {}  # the tolerances the export verified with
    with timed("running the artifact and eager PyTorch"):
        report = reloaded.verify(check_inputs, atol=recorded.get("atol", 1e-4) if args.atol is None else args.atol,
                                 rtol=recorded.get("rtol", 1e-3) if args.rtol is None else args.rtol,
                                 reference=model)
    # The saved export.json keeps the report of the check of the files on disk (written atomically).
    exported.manifest = record_verification(path, reloaded.manifest["verification"])
    print(report)
    if args.report:
        write_report(Path(args.report), args, exported, progress.lines, report, shapes)
    return EXIT_OK if report.passed else EXIT_MISMATCH


























def build_parser() -> argparse.ArgumentParser:
    try:
        version = metadata.version("hfexport-core")
    except metadata.PackageNotFoundError:  # pragma: no cover
        version = "unknown"
    parser = argparse.ArgumentParser(
        prog="hfexport", formatter_class=argparse.RawDescriptionHelpFormatter, epilog=EPILOG,
        description="Export Hugging Face Transformers models through torch.export to .pt2, ONNX, ExecuTorch or OpenVINO, "
                    "and verify every export on its runtime against eager PyTorch.")
    parser.add_argument("--version", action="version", version=f"hfexport {version}")
    parser.add_argument("--debug", action="store_true",
                        help="on an error, show the full traceback (every command; errors are one line without it)")
    parser.add_argument("--verbose", "-v", action="store_true",
                        help="show everything: hfexport's info lines (bounds chosen, workarounds installed) and the "
                             "third-party warnings and progress bars it filters out of its commands by default "
                             "(same as HFEXPORT_VERBOSE=1)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    p = sub.add_parser("export", help="export a model directory (or the demo model), save it and verify it",
                       formatter_class=argparse.RawDescriptionHelpFormatter, epilog=EPILOG)
    p.add_argument("model", nargs="?", help="a local Transformers model directory (config.json + weights), or a Hub "
                   "model id org/name (fetched through huggingface_hub into its cache: config, safetensors, "
                   "tokenizer); a *ForCausalLM exports for --task text-generation unless told otherwise")
    p.add_argument("--backend", "-b", default="dynamo", help="backend name, see `hfexport backends` (default: dynamo)")
    p.add_argument("--output", "-o", help="artifact directory (default: out/<backend>)")
    p.add_argument("--dynamic", action="store_true", help="dynamic batch and sequence dims (Dim.AUTO on every dim)")
    p.add_argument("--no-verify", action="store_true", help="save the export even when its outputs differ from eager "
                   "on the traced inputs (export.json records the report), and skip the check of the saved artifact")
    p.add_argument("--overwrite", action="store_true", help="replace a non-empty output directory")
    p.add_argument("--atol", type=float, help="absolute tolerance of the verification (default: the backend's, "
                                              "1e-4 on float32 runtimes, 5e-2 on executorch-cuda)")
    p.add_argument("--rtol", type=float, help="relative tolerance of the verification (default: the backend's, "
                                              "1e-3 on float32 runtimes, 5e-2 on executorch-cuda)")
    p.add_argument("--debug", "--traceback", dest="debug", action="store_true", default=argparse.SUPPRESS,
                   help="on an error, show the full (chained) traceback, not only the one-line message")
    p.add_argument("--report", metavar="FILE", help="also write the stages, workarounds and verification as markdown")
    p.add_argument("--quantize", metavar="RECIPE", help="quantize with a recipe of the backend (onnx: "
                   f"{', '.join(QUANTIZE_RECIPES['onnx'])}; executorch-xnnpack: "
                   f"{', '.join(QUANTIZE_RECIPES['executorch-xnnpack'])}; openvino: "
                   f"{', '.join(QUANTIZE_RECIPES['openvino'])}); verified against float eager by cosine similarity")
    p.add_argument("--group-size", type=int, metavar="N", help="with --quantize: weights per scale of a grouped "
                   "recipe (onnx int4 / int8-dynamic: MatMulNBits block_size, 16-256, default 32 / 128; "
                   "executorch-xnnpack 8da4w: a multiple of 32, default 32; openvino int4-weights: default 128, a "
                   "layer whose width N does not divide gets the largest power of two >= 32 that does)")
    p.add_argument("--ratio", type=float, metavar="R", help="with --quantize int4-weights (openvino): the share "
                   "of the MatMul weights in int4, in (0, 1] (the others int8; default 1)")
    p.add_argument("--sym", action=argparse.BooleanOptionalAction, default=None, help="with --quantize: symmetric "
                   "weights, one scale and no zero point (--no-sym: a zero point per group). Defaults: openvino "
                   "int4-weights / int8-weights asymmetric (NNCF's INT4_ASYM; --sym: INT4_SYM), onnx int4 / "
                   "int8-dynamic symmetric (MatMulNBits is_symmetric), executorch-xnnpack 8da4w / 8da8w symmetric only")
    p.add_argument("--qembedding", choices=("4w", "8w"), help="with --quantize 8da4w or 8da8w (executorch-xnnpack): "
                   "also quantize the embedding tables, weight-only: 4w int4 (one scale per 32 weights of a row), "
                   "8w int8 (one scale per row); the other recipes quantize embedding tables int8 already")
    p.add_argument("--dtype", choices=tuple(DTYPES), help="cast the model's weights to this dtype before the "
                   "export (fp16, bf16; default: as the model loads, float32); verified against eager in that dtype, with "
                   "atol and rtol 1e-2 (fp16) or 5e-2 (bf16) unless --atol/--rtol")
    p.add_argument("--trust-remote-code", action="store_true", help="allow a model whose config.json maps its "
                   "classes to code in its repository (auto_map): loading it runs that code; off by default, only "
                   "for a model from a source you trust")
    p.add_argument("--revision", help="with a Hub model id: the branch, tag or commit (default main)")
    p.set_defaults(func=_cmd_export, demo=None)


    p = sub.add_parser("backends", help="list installed backends: name, the distribution that provides it and its "
                                        "version, the toolchain it lowers with and that one's version, status")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--no-load", action="store_true", help="read entry point metadata only (no plugin import)")
    p.set_defaults(func=_cmd_backends)

    p = sub.add_parser("stages", help="list a backend's stages and their extension points")
    p.add_argument("backend")
    p.set_defaults(func=_cmd_stages)

    p = sub.add_parser("workarounds", help="list registered patches and FX fixes (with where they come from)")
    p.add_argument("--scope", help="only this scope (dynamo, onnx, executorch, executorch.cuda, ...)")
    p.add_argument("--kind", help="only this kind (patch, fx_node_fix, fx_program_fix, onnx_translation, ...)")
    p.add_argument("--check", action="store_true",
                   help="resolve every patch target and scope (nothing installed) and mark those that resolve to "
                        "nothing as UNRESOLVED; exit status 1 if any")
    p.add_argument("--import", dest="imports", action="append", metavar="MODULE",
                   help="import MODULE first, so that the workarounds it registers are listed (repeatable)")
    p.set_defaults(func=_cmd_workarounds)

    p = sub.add_parser("verify", help="check a saved artifact: manifest, paths, SHA-256 of every file, loading "
                                      "(no code from it), a run; against eager with --model",
                       description="Check a saved artifact as hfexport.load does and say what was checked: the "
                                   "manifest's schema, that every file it names lies inside the directory, every "
                                   "file's size and SHA-256, that every component opens with no code run from the "
                                   "artifact; then run the default component on inputs of the recorded shapes "
                                   "and, with --model, compare with eager PyTorch. Exit status: 0 ok, 1 a check "
                                   "failed, 3 outputs differ from eager.")
    p.add_argument("artifact", help="the artifact directory (holds export.json), or a Hub repository id org/name "
                                    "(downloads export.json, then only the files it names)")
    p.add_argument("--revision", help="with a Hub repository id: the branch, tag or commit (default main)")
    p.add_argument("--subfolder", help="the artifact's folder in the repository or directory (push_to_hub's "
                                       "default is hfexport/<backend>)")
    p.add_argument("--model", help="the exported model's directory: compare the artifact with it on eager PyTorch")
    p.add_argument("--atol", type=float, help="absolute tolerance of the comparison (default: the one the export "
                                              "verified with, in export.json; else 1e-4)")
    p.add_argument("--rtol", type=float, help="relative tolerance of the comparison (default: the one the export "
                                              "verified with, in export.json; else 1e-3)")
    p.add_argument("--no-run", action="store_true", help="check files and loading only; run nothing")
    p.add_argument("--trust-remote-code", action="store_true",
                   help="allow what loading refuses by default (unpickling objects from a .pt2, importing the "
                        "modules its output types name): only for an artifact from a source you trust")
    p.set_defaults(func=_cmd_verify)

    # Commands contributed by plugins: ``register(subparsers)`` adds a subcommand, or options to one
    # (hfexport-dynamo adds ``export --demo``).
    for ep in metadata.entry_points(group="hfexport.commands"):
        try:
            ep.load()(sub)
        except Exception as exc:
            print(f"warning: command plugin {ep.name} ({ep.value}) failed to load: {exc}", file=sys.stderr)
    for command in {id(c): c for c in sub.choices.values()}.values():  # --debug after the command's name too
        if "--debug" not in command._option_string_actions:
            command.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                                 help="on an error, show the full traceback")
        if "--verbose" not in command._option_string_actions:
            command.add_argument("--verbose", "-v", action="store_true", default=argparse.SUPPRESS,
                                 help="show everything (see `hfexport --help`)")
    return parser


def _one_line(exc: BaseException) -> str:
    """The error as one line: the message's lines joined (an ExportError's next steps included)."""
    text = " ".join(line.strip() for line in str(exc).strip().splitlines() if line.strip())
    return text or type(exc).__name__


@contextlib.contextmanager
def _warnings_in_hfexport_format() -> Iterator[None]:
    """hfexport's own warnings (its warning classes, its ``hfexport`` logger) as one ``warning: ...`` line each on
    stderr, like its errors, instead of Python's ``path:line: Category: message`` or a bare ``WARNING:hfexport:``;
    third parties' warnings keep their format."""
    import warnings

    original = warnings.showwarning

    def show(message: Any, category: type[Warning], filename: str, lineno: int, file: Any = None,
             line: str | None = None) -> None:
        if category.__module__.split(".")[0].startswith("hfexport"):
            print(f"warning: {message}", file=sys.stderr)
        else:
            original(message, category, filename, lineno, file, line)

    class _Line(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            print(f"{record.levelname.lower()}: {record.getMessage()}", file=sys.stderr)

    logger, handler = logging.getLogger("hfexport"), _Line(logging.INFO if verbose() else logging.WARNING)
    logger.addHandler(handler)
    propagate, logger.propagate = logger.propagate, False
    level = logger.level
    if verbose() and logger.getEffectiveLevel() > logging.INFO:
        logger.setLevel(logging.INFO)
    warnings.showwarning = show
    try:
        yield
    finally:
        warnings.showwarning = original
        logger.removeHandler(handler)
        logger.propagate = propagate
        logger.setLevel(level)


def main(argv: list[str] | None = None) -> int:
    """Run the command line; returns the exit status (0 ok, 1 error, 2 bad usage, 3 verification mismatch).

    An error prints one line on stderr (``error: ...``); ``--debug`` prints the traceback before it.
    """
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return EXIT_USAGE
    from ._artifact import VerificationError
    from ._discovery import UnknownBackendError

    if args.verbose:
        os.environ[VERBOSE_ENV] = "1"  # the filters ask it; the processes a command starts inherit it
    try:
        with _warnings_in_hfexport_format():
            return args.func(args)
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130
    except SystemExit as exc:
        if not isinstance(exc.code, str):
            raise
        print(exc.code if exc.code.startswith("error:") else f"error: {exc.code}", file=sys.stderr)
        return EXIT_USAGE  # a command that refuses its arguments with a message
    except VerificationError as exc:  # the export ran but its outputs differ from eager: the report, then exit 3
        if args.debug:
            import traceback

            traceback.print_exc()
        print(exc.report)
        print(f"error: {_one_line(exc)}", file=sys.stderr)
        return EXIT_MISMATCH
    except Exception as exc:  # noqa: BLE001 - every error becomes one line and an exit status
        usage = isinstance(exc, UsageError | UnknownBackendError)
        if args.debug:
            import traceback

            traceback.print_exc()
        hint = "" if args.debug or usage else " (--debug shows the traceback)"
        kind = "" if usage or type(exc).__module__.startswith("hfexport") else f"{type(exc).__name__}: "
        print(f"error: {kind}{_one_line(exc)}{hint}", file=sys.stderr)
        return EXIT_USAGE if usage else EXIT_ERROR


if __name__ == "__main__":
    sys.exit(main())
