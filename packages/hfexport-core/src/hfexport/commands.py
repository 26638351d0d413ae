"""What a command plugin builds on (the ``hfexport.commands`` entry point group).

A distribution adds subcommands, or options to the kernel's, with an entry point
``register(subparsers: argparse._SubParsersAction) -> None`` in the group ``hfexport.commands`` (hfexport-dynamo adds
``export --demo``, ``export --task`` and ``generate``). Its command functions take the parsed
``argparse.Namespace`` and return an exit status; they raise :class:`UsageError` for bad arguments (exit status 2,
the message printed on one line) and report an export's stages with :class:`Progress`.

Kept light: importing this module imports neither torch nor any toolchain.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

__all__ = ["DTYPES", "EXIT_ERROR", "EXIT_MISMATCH", "EXIT_OK", "EXIT_USAGE", "VERBOSE_ENV", "Progress", "UsageError", "say_export_cost",
           "checkpoint_dtype", "configured_exporter", "console", "load_model", "model_summary", "quantization_knobs", "quiet_third_party_logs",
           "record_source_dtype", "record_verification", "resolve_artifact", "say", "timed", "verbose", "write_report"]

EXIT_OK, EXIT_ERROR, EXIT_USAGE, EXIT_MISMATCH = 0, 1, 2, 3


# ``hfexport --verbose`` sets it for the command and the processes it starts (a sweep's workers).
VERBOSE_ENV = "HFEXPORT_VERBOSE"


def verbose() -> bool:
    """Whether hfexport shows everything: ``hfexport --verbose`` (or ``HFEXPORT_VERBOSE=1`` in the environment).

    By default hfexport keeps out of its commands' output the third-party lines a user can do nothing about (torch's
    pytree deprecation warnings about torchao's enums, transformers' per-weight loading bar, ExecuTorch's
    ``cpuinfo_utils.cpp`` and ``No temp allocator provided`` lines); each filter asks this first and passes
    everything when it is true. Only hfexport's own calls are filtered; a user's own calls keep their settings.
    """
    return os.environ.get(VERBOSE_ENV, "").strip().lower() not in ("", "0", "false", "no")


# Third-party log lines a user can do nothing about, dropped inside hfexport's commands: logger -> message parts.
# torchao (imported by transformers and executorch) registers Enum constants as pytree nodes, and torch logs a
# deprecation warning for each on every run; torch.utils.cpp_extension (imported by NNCF, OpenVINO's weight
# compression) says at import that there is no CUDA runtime on a CPU machine.
_NOISE = {"torch.utils._pytree": ("is an Enum subclass", "register_constant"),
          "torch.utils.cpp_extension": ("No CUDA runtime is found",)}


class _DropNoise(logging.Filter):
    def __init__(self, parts: tuple[str, ...]):
        super().__init__()
        self.parts = parts

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # noqa: BLE001 - a record that does not format is not ours to drop
            return True
        return not any(part in message for part in self.parts)


def quiet_third_party_logs() -> None:
    """Inside a command: drop the third-party log lines of :data:`_NOISE` (torch's pytree deprecation warnings
    about torchao's enums, torch.utils.cpp_extension's "No CUDA runtime is found"), by filters on their loggers
    that hold before the module that logs is imported and whatever level torch's logging sets later; idempotent;
    nothing is changed when :func:`verbose`."""
    if verbose():
        return
    for name, parts in _NOISE.items():
        logger = logging.getLogger(name)
        if not any(isinstance(f, _DropNoise) for f in logger.filters):
            logger.addFilter(_DropNoise(parts))


class UsageError(Exception):
    """A command was called wrongly (exit status 2); the message says what to pass instead."""


def console() -> Any:
    from rich.console import Console

    return Console(stderr=True, highlight=False, soft_wrap=True)


_STARTED = time.perf_counter()  # when the command began (this module is imported first thing by the CLI)


def say(text: str) -> None:
    """A progress line on stderr, led by the seconds since the command started: ``[hfexport 41.2s] saving ...``;
    between stage lines, so that saving, loading back and verifying are never silent."""
    print(f"[hfexport {time.perf_counter() - _STARTED:.1f}s] {text}", file=sys.stderr, flush=True)


class timed:  # noqa: N801 - used as a function: ``with timed("saving to out/x"):``
    """``with timed("loading the model"):`` says ``loading the model ...`` and, at the end, ``... done in 3.2s``."""

    def __init__(self, what: str):
        self.what = what

    def __enter__(self) -> timed:
        say(f"{self.what} ...")
        self._began = time.perf_counter()
        return self

    def __exit__(self, kind: Any, *rest: Any) -> None:
        if kind is None:
            say(f"{self.what} done in {time.perf_counter() - self._began:.1f}s")


def model_summary(directory: str | Path) -> str:
    """What ``config.json`` of ``directory`` names, read as JSON alone (no transformers): its first architecture,
    else its ``model_type``, else ``"the model"``."""
    import json

    try:
        config = json.loads((Path(directory) / "config.json").read_text())
    except (OSError, ValueError):
        return "the model"
    architectures = config.get("architectures") if isinstance(config, dict) else None
    if isinstance(architectures, list) and architectures and isinstance(architectures[0], str):
        return architectures[0]
    model_type = config.get("model_type") if isinstance(config, dict) else None
    return f"a {model_type} model" if isinstance(model_type, str) else "the model"


class Progress:
    """Progress of an export on stderr: on a terminal, a spinner on the running stage and one line per stage and
    toolchain step when it ends (✅/❌ with seconds); elsewhere (a log file, CI), plain lines when a stage starts and
    when a stage or step ends, each led by the seconds since the command started, so that a long lowering is never
    silent. Keeps the stage lines for --report."""

    def __init__(self, console: Any):
        self.console = console
        self.enabled = console.is_terminal
        self._status: Any = None
        self._began = _STARTED  # the seconds since the command started, as say() counts them
        self.lines: list[str] = []

    def _log(self, text: str) -> None:
        """A plain line for a log: ``[hfexport 12.3s] text``."""
        print(f"[hfexport {time.perf_counter() - self._began:.1f}s] {text}", file=sys.stderr, flush=True)

    def __call__(self, event: Any) -> None:
        from rich.markup import escape  # "[dynamo 1/5]" is not rich markup

        if event.step:  # a toolchain call, between stages or inside one: its own line when it ends
            label = f"{'    ' * event.depth}→ {event.step}"
            if event.status == "start":  # a long call (the trace, a conversion) says it began
                if not self.enabled:
                    self._log(f"{'  ' * event.depth}→ {event.step} ...")
                elif self._status is not None:
                    self._status.update(escape(label))
                return
            mark = "✅" if event.status == "done" else "❌"
            if self.enabled:
                self.console.print(escape(f"{label} {mark} {event.seconds:.2f}s"))
            else:
                self._log(f"{'  ' * event.depth}→ {event.step} {event.status} in {event.seconds:.2f}s")
            return
        if event.status != "start":
            mark = "✅" if event.status == "done" else "❌"
            self.lines.append(f"| {event.backend} | {'  ' * event.depth}{event.stage.number}/{event.total} "
                              f"{event.stage.title} | {mark} | {event.seconds:.2f} |")
        indent = "    " * event.depth
        label = f"{indent}[{event.backend} {event.stage.number}/{event.total}] {event.stage.title}"
        if not self.enabled:
            self._log(label.strip() + (" ..." if event.status == "start"
                                       else f" {event.status} in {event.seconds:.2f}s"))
            return
        label = escape(label)
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


def configured_exporter(exporter_class: Any, args: argparse.Namespace, **options: Any) -> Any:
    """The backend's exporter with the command's options (``--quantize`` and its knobs ``--group-size``,
    ``--ratio``, ``--sym``, ``--qembedding``, as a :class:`hfexport.Quantization`); an option it refuses is a usage
    error."""
    knobs = quantization_knobs(args)
    if getattr(args, "quantize", None):
        if "quantize" not in exporter_class.config_class.option_names():
            raise UsageError(f"backend {args.backend!r} does not quantize (--quantize {args.quantize}): export with a "
                             "backend that does (`hfexport backends` lists them; each documents its recipes)")
        if knobs:
            from ._quantization import Quantization

            try:
                options["quantize"] = Quantization(args.quantize, **knobs)
            except TypeError as exc:
                raise UsageError(f"--quantize {args.quantize}: {exc}") from exc
        else:
            options["quantize"] = args.quantize
    try:
        return exporter_class(**options)
    except (TypeError, ValueError) as exc:  # a recipe the backend does not support names those it does
        raise UsageError(str(exc)) from exc


def say_export_cost(exporter: Any, model: Any, output: Path, args: argparse.Namespace) -> None:
    """The line ``weights ...; estimated peak ...; artifact ...; this machine: ...`` (the disk free where ``output``
    goes), before the export starts; refused there (:class:`hfexport.InsufficientResourcesError`) unless
    ``--no-resource-check``. The export checks memory again, once, before its trace."""
    from ._cost import check_export_cost

    existing = output.absolute()  # the free disk where the artifact will go: the nearest directory that exists
    while not existing.is_dir() and existing != existing.parent:
        existing = existing.parent
    say(check_export_cost(exporter, model, existing, refuse=False).line())
    if not getattr(args, "no_resource_check", False):
        check_export_cost(exporter, model, existing)


# ``export``'s quantization knobs: flag -> Quantization field
_QUANTIZATION_FLAGS = {"group_size": "--group-size", "ratio": "--ratio", "sym": "--sym", "qembedding": "--qembedding"}


def quantization_knobs(args: argparse.Namespace) -> dict[str, Any]:
    """The :class:`hfexport.Quantization` options ``args`` give (``--group-size`` -> ``group_size``, ``--ratio``,
    ``--sym`` -> ``symmetric``, ``--qembedding`` -> ``embedding``).

    Raises:
        UsageError: a knob given without ``--quantize``.
    """
    given = {name: getattr(args, name, None) for name in _QUANTIZATION_FLAGS}
    given = {name: value for name, value in given.items() if value is not None}
    if given and not getattr(args, "quantize", None):
        raise UsageError(f"{', '.join(_QUANTIZATION_FLAGS[n] for n in given)} tune{'s' if len(given) == 1 else ''} a "
                         "quantization recipe: pass --quantize RECIPE too (e.g. --quantize int4-weights on openvino)")
    names = {"group_size": "group_size", "ratio": "ratio", "sym": "symmetric", "qembedding": "embedding"}
    return {names[name]: value for name, value in given.items()}


DTYPES = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}


def checkpoint_dtype(path: str | Path) -> str | None:
    """The floating dtype a Transformers model directory stores its weights in (``"bfloat16"`` for most checkpoints
    people ship): ``config.json``'s ``dtype`` (``torch_dtype`` before Transformers 5), else the first floating
    tensor of its first ``.safetensors`` file's header; None when neither says."""
    import json
    import struct

    directory = Path(path)
    try:
        config = json.loads((directory / "config.json").read_text())
    except (OSError, ValueError):
        config = {}
    named = config.get("dtype") or config.get("torch_dtype") if isinstance(config, dict) else None
    if isinstance(named, str) and named.removeprefix("torch.") in DTYPES.values():
        return named.removeprefix("torch.")
    names = {"BF16": "bfloat16", "F16": "float16", "F32": "float32"}
    for shard in sorted(directory.glob("*.safetensors"))[:1]:
        try:
            with shard.open("rb") as f:
                (size,) = struct.unpack("<Q", f.read(8))
                header = json.loads(f.read(min(size, 100_000_000)))
        except (OSError, ValueError, struct.error):
            return None
        return next((names[t["dtype"]] for t in header.values() if isinstance(t, dict) and t.get("dtype") in names),
                    None)
    return None


def load_model(exporter_class: Any, args: argparse.Namespace) -> Any:
    """The model of ``args.model`` as the backend's loader gives it, with ``--trust-remote-code`` (the model's own
    code, when the loader takes it), in ``--dtype`` (fp32, fp16, bf16).

    Without ``--dtype``, a half-precision checkpoint (bf16, fp16) loads in float32: each tensor widened exactly as
    it is read, so the model holds the weights once, in float32, and the CPU runtimes (ONNX Runtime, XNNPACK,
    OpenVINO) compute in float32, token-exact against eager on the same weights (their own bf16 paths are not: ONNX
    Runtime's CPU provider has no bf16 MatMul, XNNPACK runs bf16 models in float32 anyway, and OpenVINO's CPU plugin
    picks its own precision). The checkpoint's dtype is kept as ``args.source_dtype`` (the manifest's
    ``source_dtype``). A loader that takes no ``dtype`` keyword loads as it does and is cast after (a second copy
    while casting)."""
    import inspect

    import torch

    source = checkpoint_dtype(args.model)
    dtype = getattr(args, "dtype", None)
    want = getattr(torch, DTYPES[dtype]) if dtype else torch.float32 if source in ("bfloat16", "float16") else None
    args.source_dtype = source
    options: dict[str, Any] = {}
    try:
        takes = set(inspect.signature(exporter_class.tracer.load_model).parameters)
    except (AttributeError, TypeError, ValueError):
        takes = set()
    if args.trust_remote_code:
        if "trust_remote_code" not in takes:
            raise UsageError(f"backend {args.backend!r} loads models without trust_remote_code")
        options["trust_remote_code"] = True
    if want is not None and "dtype" in takes:
        options["dtype"] = want
    model = exporter_class.tracer.load_model(args.model, **options) if options else exporter_class.load_model(
        args.model)
    if want is not None and "dtype" not in options:
        model = model.to(want)
    return model


def record_source_dtype(exported: Any, args: argparse.Namespace) -> None:
    """The manifest's ``source_dtype``: the checkpoint's (``load_model`` read it), not the dtype the model was
    loaded in (a bf16 checkpoint exports in float32 and records ``"bfloat16"``)."""
    source = getattr(args, "source_dtype", None)
    if source:
        exported.manifest["source_dtype"] = source


def write_report(path: Path, args: argparse.Namespace, exported: Any, stage_lines: list[str], report: Any,
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


def resolve_artifact(artifact: str, revision: str | None = None, subfolder: str | None = None) -> str:
    """The local directory of ``artifact``: a Hub repository id (``org/name``) is downloaded (``export.json``, then
    only the files it names, into the Hugging Face cache); a local path gets ``subfolder`` appended.

    Raises:
        UsageError: ``revision`` given with a local path.
    """
    from ._hub import download_artifact, is_hub_reference

    if is_hub_reference(artifact):
        return str(download_artifact(artifact, revision=revision, subfolder=subfolder))
    if revision is not None:
        raise UsageError(f"--revision is for a Hub repository id (org/name); {artifact} is a local path")
    return str(Path(artifact) / subfolder) if subfolder else artifact


def record_verification(directory: Path, verification: dict[str, Any]) -> dict[str, Any]:
    """Write ``verification`` (the check of the artifact loaded back from disk) into the saved ``export.json`` of
    ``directory``, atomically (a new file renamed over the old one); returns the new manifest."""
    from ._artifact import MANIFEST_NAME
    from ._saving import update_manifest

    return update_manifest(directory, MANIFEST_NAME, {"verification": verification})
