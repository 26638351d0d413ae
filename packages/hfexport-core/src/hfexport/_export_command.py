"""``hfexport export``: the checks made before any model or toolchain loads (the model directory or Hub id, its
weights and ``auto_map``, the task, the output directory and ``--report``), then the export, the save, the reload
from disk and the check of the reloaded artifact against eager PyTorch. A task export (``--task``) is handed to
the command plugin that adds ``--task`` (hfexport-dynamo) after the shared checks.
"""

from __future__ import annotations

import argparse
import difflib
import os
import sys
import time
from pathlib import Path
from typing import Any

from .commands import (
    EXIT_MISMATCH,
    EXIT_OK,
    Progress,
    UsageError,
    configured_exporter,
    console,
    load_model,
    model_summary,
    quiet_third_party_logs,
    record_source_dtype,
    record_verification,
    say,
    say_export_cost,
    timed,
    write_report,
)


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
    exporter = configured_exporter(exporter_class, args, dynamic=dynamic)
    say_export_cost(exporter, model, output, args)  # its cost, refused here when this machine cannot hold it
    progress = Progress(out)
    try:  # verified on the traced inputs (a mismatch exits 3; --no-verify records it in export.json instead)
        exported = exporter.export(model, inputs, progress=progress, verify=not args.no_verify, atol=args.atol,
                                   rtol=args.rtol, check_resources=not args.no_resource_check)
    except ExportError:
        progress.stop()
        raise  # main() prints it on one line (the traceback with --debug) and exits 1
    finally:
        progress.stop()
    record_source_dtype(exported, args)
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
