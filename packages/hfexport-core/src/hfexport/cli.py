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

EXIT_OK, EXIT_ERROR, EXIT_USAGE, EXIT_MISMATCH = 0, 1, 2, 3


class UsageError(Exception):
    """A command was called wrongly (exit status 2); the message says what to pass instead."""


def _console() -> Any:
    from rich.console import Console

    return Console(stderr=True, highlight=False, soft_wrap=True)


class _Progress:
    """Progress of an export on stderr: on a terminal, a spinner on the running stage and one line per stage and
    toolchain step when it ends (✅/❌ with seconds); elsewhere (a log file, CI), plain lines when a stage starts and
    when a stage or step ends, each led by the seconds since the export began, so that a long lowering is never
    silent. Keeps the stage lines for --report."""

    def __init__(self, console: Any):
        self.console = console
        self.enabled = console.is_terminal
        self._status: Any = None
        self._began = time.perf_counter()
        self.lines: list[str] = []

    def _log(self, text: str) -> None:
        """A plain line for a log: ``[hfexport 12.3s] text``."""
        print(f"[hfexport {time.perf_counter() - self._began:.1f}s] {text}", file=sys.stderr, flush=True)

    def __call__(self, event: Any) -> None:
        from rich.markup import escape  # "[dynamo 1/5]" is not rich markup

        if event.step:  # a toolchain call inside a stage: one indented line when it ends
            if event.status != "start":
                mark = "✅" if event.status == "done" else "❌"
                if self.enabled:
                    self.console.print(escape(f"{'    ' * event.depth}→ {event.step} {mark} {event.seconds:.2f}s"))
                else:
                    self._log(f"{'  ' * event.depth}→ {event.step} {event.status} in {event.seconds:.2f}s")
            return
        if event.status != "start":
            mark = "✅" if event.status == "done" else "❌"
            self.lines.append(f"| {event.backend} | {'  ' * event.depth}{event.stage.number}/{event.total} "
                              f"{event.stage.title} | {mark} | {event.seconds:.2f} |")
        indent = "    " * event.depth
        label = f"{indent}[{event.backend} {event.stage.number}/{event.total}] {event.stage.title}"
        if event.stage.runs:
            label += f" → {event.stage.runs}"
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


def _cmd_backends(args: argparse.Namespace) -> int:
    from ._discovery import list_backends

    infos = list_backends(load=not args.no_load)
    if args.json:
        print(json.dumps([{"name": i.name, "distribution": i.distribution, "version": i.version,
                           "status": i.status, "error": i.error, "note": i.note, "entry_point": i.value}
                          for i in infos], indent=2))
        return 0
    rows = [("name", "distribution", "version", "status")]
    rows += [(i.name, i.distribution, i.version, i.status + (f": {i.error}" if i.error else "")
              + (f" ({i.note})" if i.note else "")) for i in infos]
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


def _cmd_verify(args: argparse.Namespace) -> int:
    from ._hub import is_hub_reference
    from ._verify import verify_artifact

    artifact = args.artifact
    if is_hub_reference(artifact):  # org/name: export.json, then only the files it names, into the HF cache
        from ._hub import download_artifact

        artifact = download_artifact(artifact, revision=args.revision, subfolder=args.subfolder)
        print(f"·  hub       {args.artifact}: export.json and the files it names, in {artifact}")
    elif args.revision is not None:
        raise UsageError(f"--revision is for a Hub repository id (org/name); {artifact} is a local path")
    elif args.subfolder:
        artifact = str(Path(artifact) / args.subfolder)
    if not Path(artifact).is_dir():
        raise UsageError(f"{artifact} is not a directory: give the directory of a saved export (it holds "
                         "export.json), or a Hub repository id (org/name)")
    if args.model is not None and not Path(args.model).is_dir():
        raise UsageError(f"--model {args.model} is not a directory: give the exported model's directory")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    logging.getLogger("torch.utils._pytree").setLevel(logging.ERROR)
    return verify_artifact(artifact, model=args.model, atol=args.atol, rtol=args.rtol,
                           trust_remote_code=args.trust_remote_code, run=not args.no_run)


GENERATE_EPILOG = """\
examples:
  # first, a task export (one decoder program for prefill and decode, the weights stored once; the model
  # directory's tokenizer files are copied along)
  hfexport export ./my-llm --task text-generation --max-cache-len 128 -o out/gen
  # one prompt as token ids
  hfexport generate out/gen --input-ids 1,306,4966 --max-new-tokens 20
  # a batch of two: the shorter prompt is left-padded and masked
  hfexport generate out/gen --input-ids 5,6,7 --input-ids 8,9 --max-new-tokens 8
  # text in, text out: the tokenizer in out/gen, or the one of --tokenizer DIR
  hfexport generate out/gen --prompt "Hello, my name is" --max-new-tokens 20
  hfexport generate out/gen --prompt "Hello" --tokenizer ./my-llm --max-new-tokens 20 --eos-token-id 2
  # an artifact on the Hub (push_to_hub's folder)
  hfexport generate org/name --subfolder hfexport/dynamo --input-ids 1,2,3 --max-new-tokens 8

Greedy decoding (do_sample=False) over the artifact's exported programs on its backend's runtime: the same
token ids as eager model.generate(do_sample=False). A decoder runs its one program for the prefill (the prompt,
in chunks of prefill_chunk tokens) and then once per new token, over a KV cache of max_cache_len positions
(written in place on ONNX Runtime, which binds the cache outputs to the inputs' memory, and on ExecuTorch, in the
program's mutable buffers); an encoder-decoder runs its encoder, prefill and decode programs. Prints every row's token
ids (prompt | new), the text with a tokenizer, the prefill latency and the decode throughput. The prompt plus
--max-new-tokens must fit the export's max_cache_len, and the batch its max_batch (export.json, "generation").
Exit status: 0 ok, 1 a runtime failure, 2 bad usage (no or two kinds of prompt, an artifact exported
without --task, a prompt beyond the export's bounds, --prompt without a tokenizer).
"""


def _parse_ids(text: str, flag: str) -> list[int]:
    """``"1,2,3"`` (or ``"1 2 3"``) as token ids; a usage error that names the bad item otherwise."""
    items = [item for item in text.replace(",", " ").split() if item]
    if not items:
        raise UsageError(f"{flag} {text!r} holds no token ids: give comma-separated integers, e.g. {flag} 1,2,3")
    ids = []
    for item in items:
        try:
            ids.append(int(item))
        except ValueError:
            raise UsageError(f"{flag} {text!r}: {item!r} is not a token id (give comma-separated integers, e.g. "
                             f"{flag} 1,2,3)") from None
    return ids


def _check_generation_bounds(directory: Path, args: argparse.Namespace, rows: list[list[int]]) -> None:
    """Refuse from the manifest alone (hfexport's own reader, as ``load`` reads it) what ``generate`` would refuse
    after loading the runtime: an export for one forward pass, a batch beyond ``max_batch``, and token ids plus
    ``--max-new-tokens`` beyond a decoder's ``max_cache_len``. A manifest that does not read is left to ``load``,
    whose error says why."""
    from ._artifact import read_manifest

    try:
        manifest = read_manifest(directory)
    except (OSError, ValueError):
        return
    section = manifest.get("generation")
    if not manifest.get("task") or not isinstance(section, dict):
        raise UsageError(f"this {manifest.get('backend')} artifact of {manifest.get('model_class')} was exported for "
                         "one forward pass and cannot generate: export it with task='text-generation' (decoders), "
                         "'text2text-generation' (encoder-decoders) or 'automatic-speech-recognition' (Whisper), or "
                         "`hfexport export MODEL --task ...`")
    batch, cache = section.get("max_batch"), section.get("max_cache_len")
    if rows and isinstance(batch, int) and len(rows) > batch:
        raise UsageError(f"a batch of {len(rows)} exceeds this export's max_batch={batch}: give at most {batch} "
                         "--input-ids, or re-export with a larger --max-batch")
    longest = max((len(r) for r in rows), default=0)
    if manifest["task"] == "text-generation" and longest and isinstance(cache, int) \
            and longest + args.max_new_tokens > cache:
        raise UsageError(f"a prompt of {longest} tokens plus max_new_tokens={args.max_new_tokens} exceeds this "
                         f"export's max_cache_len={cache}: give at most {cache - longest} new tokens, or re-export "
                         "with a larger --max-cache-len")


def _cmd_generate(args: argparse.Namespace) -> int:
    from ._hub import is_hub_reference

    if bool(args.input_ids) == bool(args.prompt):
        raise UsageError("give the prompt as token ids (--input-ids 1,2,3; repeat it for a batch) or as text "
                         f"(--prompt TEXT, with a tokenizer), {'not both' if args.input_ids else 'one of them'}")
    if args.max_new_tokens is None:
        raise UsageError("pass --max-new-tokens N (the number of tokens to generate)")
    if args.max_new_tokens < 1:
        raise UsageError(f"--max-new-tokens must be 1 or more, got {args.max_new_tokens}")
    rows = [_parse_ids(text, "--input-ids") for text in args.input_ids or ()]
    eos = _parse_ids(args.eos_token_id, "--eos-token-id") if args.eos_token_id is not None else None
    if args.tokenizer is not None:
        if not Path(args.tokenizer).is_dir():
            raise UsageError(f"--tokenizer {args.tokenizer} is not a directory: give the exported model's directory "
                             "(it holds tokenizer.json or tokenizer_config.json)")
        if not _has_tokenizer(Path(args.tokenizer)):
            raise UsageError(f"--tokenizer {args.tokenizer} holds no tokenizer files ({', '.join(_TOKENIZER_MARKERS)})")
    artifact = args.artifact
    if is_hub_reference(artifact):
        from ._hub import download_artifact

        artifact = download_artifact(artifact, revision=args.revision, subfolder=args.subfolder)
    elif args.revision is not None:
        raise UsageError(f"--revision is for a Hub repository id (org/name); {artifact} is a local path")
    elif args.subfolder:
        artifact = str(Path(artifact) / args.subfolder)
    directory = Path(artifact)
    from ._artifact import MANIFEST_NAME

    if not directory.is_dir():
        raise UsageError(f"{artifact} is not a directory: give the directory of a saved export (`hfexport export "
                         "MODEL --task text-generation -o DIR` writes one), or a Hub repository id (org/name)")
    if not (directory / MANIFEST_NAME).is_file():
        raise UsageError(f"{artifact} holds no {MANIFEST_NAME}: give the directory of a saved export (`hfexport "
                         "export MODEL --task text-generation -o DIR` writes one)")
    tokenizer_dir = Path(args.tokenizer) if args.tokenizer else directory if _has_tokenizer(directory) else None
    if args.prompt and tokenizer_dir is None:
        raise UsageError(f"--prompt needs a tokenizer, and {args.artifact} holds no tokenizer files: pass --tokenizer "
                         "DIR (the exported model's directory), or the prompt as token ids with --input-ids 1,2,3")
    _check_generation_bounds(directory, args, rows)  # from export.json, before any runtime loads
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    logging.getLogger("torch.utils._pytree").setLevel(logging.ERROR)
    from ._api import load

    exported = load(directory, trust_remote_code=args.trust_remote_code)
    task = exported.manifest.get("task")
    if exported.generator is None:  # its message says which task to export with
        try:
            exported.generate(None)
        except ValueError as exc:
            raise UsageError(str(exc)) from exc
    bounds = exported.manifest.get("generation") or {}
    if task == "automatic-speech-recognition":
        raise UsageError(f"{args.artifact} transcribes speech (its encoder takes input_features), and this command "
                         "takes token ids or text: call hfexport.load(DIR).generate(input_features, "
                         "max_new_tokens=...) in Python")
    tokenizer = None
    if tokenizer_dir is not None:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    if args.prompt:
        rows = [list(tokenizer(text)["input_ids"]) for text in args.prompt]
        empty = [text for text, ids in zip(args.prompt, rows, strict=True) if not ids]
        if empty:
            raise UsageError(f"--prompt {empty[0]!r} gives no tokens: give some text")
    input_ids, attention_mask = _left_pad(rows, _prompt_pad_id(args.pad_token_id, tokenizer, bounds))
    print(f"generating with the {exported.backend} export of {exported.manifest.get('model_class')} "
          f"({task}, max_cache_len {bounds.get('max_cache_len')}, max_batch {bounds.get('max_batch')}) from "
          f"{directory}", file=sys.stderr)
    options: dict[str, Any] = {"max_new_tokens": args.max_new_tokens}
    if eos is not None:
        options["eos_token_id"] = eos[0] if len(eos) == 1 else eos
    if args.pad_token_id is not None:
        options["pad_token_id"] = args.pad_token_id
    try:
        sequences = exported.generate(input_ids, attention_mask, **options)
    except (ValueError, TypeError) as exc:  # refused before any program runs: bounds, ids outside the vocabulary
        raise UsageError(str(exc)) from exc
    stats = dict(exported.generation_stats)
    prompt_len = 0 if bounds.get("is_encoder_decoder") else input_ids.shape[1]
    result: dict[str, Any] = {"sequences": sequences.tolist(), "prompt_length": prompt_len,
                              "stats": {k: (None if v != v else v) for k, v in stats.items()}}  # NaN -> null
    if tokenizer is not None:
        result["texts"] = [tokenizer.decode(row[prompt_len:], skip_special_tokens=True)
                           for row in result["sequences"]]
    if args.json:
        print(json.dumps(result, indent=2))
        return EXIT_OK
    for r, row in enumerate(result["sequences"]):
        prompt = " ".join(map(str, row[:prompt_len]))
        print(f"sequence {r}: {prompt + ' | ' if prompt else ''}{' '.join(map(str, row[prompt_len:]))}")
    for r, text in enumerate(result.get("texts", [])):
        print(f"text {r}: {json.dumps(args.prompt[r]) + ' + ' if args.prompt else ''}{json.dumps(text)}")
    print(_stats_text(stats, sequences.shape[0]))
    return EXIT_OK


def _prompt_pad_id(pad_token_id: int | None, tokenizer: Any, bounds: dict[str, Any]) -> int:
    """The id shorter prompts are left-padded with (masked out, so it only needs to be a valid id): --pad-token-id,
    the tokenizer's, the generation config's pad, its first EOS, else 0."""
    if pad_token_id is not None:
        return pad_token_id
    if tokenizer is not None and tokenizer.pad_token_id is not None:
        return int(tokenizer.pad_token_id)
    config = bounds.get("generation_config") or {}
    for key in ("pad_token_id", "eos_token_id"):
        value = config.get(key)
        value = value[0] if isinstance(value, list) and value else value
        if isinstance(value, int):
            return value
    return 0


def _left_pad(rows: list[list[int]], pad: int) -> tuple[Any, Any]:
    """``input_ids`` and ``attention_mask`` ``[batch, longest]``, shorter rows left-padded with ``pad`` (mask 0);
    the mask is None when no row is padded."""
    import torch

    longest = max(len(row) for row in rows)
    ids = torch.tensor([[pad] * (longest - len(row)) + row for row in rows], dtype=torch.long)
    if all(len(row) == longest for row in rows):
        return ids, None
    mask = torch.tensor([[0] * (longest - len(row)) + [1] * len(row) for row in rows], dtype=torch.long)
    return ids, mask


def _cmd_workarounds(args: argparse.Namespace) -> int:
    import importlib

    from ._discovery import list_backends
    from ._registry import list_workarounds

    for module in args.imports or ():  # the user's own registrations
        try:
            importlib.import_module(module)
        except ImportError as exc:
            raise UsageError(f"--import {module}: {exc} (give an importable module name, e.g. my_patches)") from exc
    for info in list_backends():  # import every backend's exporter so that its registrations exist
        if info.status == "ok" and info.backend is not None:
            try:
                info.backend.load_exporter()
            except Exception as exc:  # listed, not fatal
                print(f"# {info.name}: {exc}", file=sys.stderr)
    unresolved = 0
    for r in list_workarounds(args.scope, args.kind):
        target = f" -> {', '.join(r.paths)}" if r.paths else ""
        target += "".join(f" ({k}={v})" for k, v in r.data.items())
        print(f"{r.scope:<20} {r.kind:<15} {r.qualified_name}{target}\n{'':<37}{r.summary}")
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


def _check_output(path: Path, overwrite: bool) -> None:
    if path.exists() and (not path.is_dir() or any(path.iterdir())) and not overwrite:
        raise UsageError(f"output directory {path} exists and is not empty; pass --overwrite to replace "
                         "it, or choose another --output")
    from ._artifact import MANIFEST_NAME

    if overwrite and path.is_dir() and any(path.iterdir()) and not (path / MANIFEST_NAME).is_file():
        raise UsageError(f"--overwrite replaces only an earlier export, and {path} is not one (it has no "
                         f"{MANIFEST_NAME}); choose another --output, or empty the directory yourself")


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
    console = _console()
    demo = getattr(args, "demo", None)  # a loader, when a command plugin contributes --demo
    if demo and args.model:
        raise UsageError(f"give a model directory or --demo, not both (got {args.model!r} and --demo)")
    if not demo and not args.model:
        raise UsageError("give a model directory (or --demo where a plugin provides one, e.g. hfexport-dynamo; "
                         "see `hfexport export --help`)")
    if not demo and not Path(args.model).is_dir():
        raise UsageError(f"model directory {args.model} does not exist (a local Transformers model directory: "
                         "config.json + weights)")
    if not demo and not (Path(args.model) / "config.json").is_file():
        raise UsageError(f"{args.model} has no config.json: give a Transformers model directory (config.json + "
                         "weights), e.g. one written by model.save_pretrained(path)")
    task = getattr(args, "task", None)
    _check_task_options(args, task, demo)
    from ._discovery import UnknownBackendError, get_backend

    # torchao (imported by transformers when installed, e.g. as an executorch dependency) registers Enum
    # constants as pytree nodes, and torch logs a deprecation warning for each on every run: nothing the
    # user of this command can act on. Errors from that logger still show.
    logging.getLogger("torch.utils._pytree").setLevel(logging.ERROR)
    from ._artifact import MANIFEST_NAME

    output = Path(args.output or f"out/{args.backend}")
    if demo and args.output is None and (output / MANIFEST_NAME).is_file():
        args.overwrite = True  # the demo's own directory: running the README's first command again replaces it
    _check_output(output, args.overwrite)  # before the toolchain loads
    try:
        backend = get_backend(args.backend)
        if task is not None and backend.tasks and task not in backend.tasks:  # before any model or toolchain loads
            close = difflib.get_close_matches(task, backend.tasks, n=1)
            raise UsageError(f"unknown task {task!r}" + (f" (did you mean {close[0]!r}?)" if close else "")
                             + f"; backend {args.backend!r} exports the tasks {', '.join(backend.tasks)}")
        exporter_class = backend.load_exporter()
    except (UnknownBackendError, ImportError, TypeError) as exc:
        raise UsageError(str(exc)) from exc
    exporter_class = _with_backend_options(exporter_class, args)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if task is not None:
        return _export_task(args, exporter_class, output, console)

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
    try:  # verified on the traced inputs (a mismatch exits 3; --no-verify records it in export.json instead)
        exported = _exporter(exporter_class, args, dynamic=dynamic).export(
            model, inputs, progress=progress, verify=not args.no_verify, atol=args.atol, rtol=args.rtol)
    except ExportError:
        progress.stop()
        raise  # main() prints it on one line (the traceback with --debug) and exits 1
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
    recorded = reloaded.manifest.get("verification") or {}  # the tolerances the export verified with
    report = reloaded.verify(check_inputs, atol=recorded.get("atol", 1e-4) if args.atol is None else args.atol,
                             rtol=recorded.get("rtol", 1e-3) if args.rtol is None else args.rtol, reference=model)
    from ._saving import update_manifest

    # The saved export.json keeps the report of the check of the files on disk (written atomically).
    exported.manifest = update_manifest(path, MANIFEST_NAME, {"verification": reloaded.manifest["verification"]})
    print(report)
    if args.report:
        _write_report(Path(args.report), args, exported, progress.lines, report, shapes)
    return EXIT_OK if report.passed else EXIT_MISMATCH


def _exporter(exporter_class: Any, args: argparse.Namespace, **options: Any) -> Any:
    """The backend's exporter with the command's options (``--quantize``); an option it refuses is a usage error."""
    if getattr(args, "quantize", None):
        if "quantize" not in exporter_class.config_class.option_names():
            raise UsageError(f"backend {args.backend!r} does not quantize (--quantize {args.quantize}): export with a "
                             "backend that does (`hfexport backends` lists them; each documents its recipes)")
        options["quantize"] = args.quantize
    try:
        return exporter_class(**options)
    except (TypeError, ValueError) as exc:  # a recipe the backend does not support names those it does
        raise UsageError(str(exc)) from exc


def _check_task_options(args: argparse.Namespace, task: str | None, demo: Any) -> None:
    """Refuse the options that belong to a task export without ``--task``, and those a task export ignores."""
    bounds = [flag for flag, value in (("--max-cache-len", args.max_cache_len), ("--max-batch", args.max_batch),
                                       ("--prefill-chunk", args.prefill_chunk)) if value is not None]
    if task is None:
        if bounds:
            raise UsageError(f"{' and '.join(bounds)} bound{'s' if len(bounds) == 1 else ''} the programs of a task export: pass --task "
                             "text-generation (or drop them for a single forward pass)")
        return
    if demo:
        raise UsageError(f"--task {task} exports a generative model directory, and the --demo model is a sentence "
                         "encoder: give a model directory (e.g. one with a ...ForCausalLM) instead of --demo")
    if args.dynamic:
        raise UsageError(f"--task {task} makes its own dims dynamic (batch up to --max-batch, sequence up to "
                         "--max-cache-len): drop --dynamic")
    for flag, value in (("--max-cache-len", args.max_cache_len), ("--max-batch", args.max_batch)):
        if value is not None and value < 1:
            raise UsageError(f"{flag} must be a positive number of tokens or sequences, got {value}")
    if args.prefill_chunk is not None and task != "text-generation":
        raise UsageError(f"--prefill-chunk bounds a decoder's prompt chunks (--task text-generation); --task {task} "
                         "exports an encoder-decoder, whose first decoder step takes the whole start sequence")


# The tokenizer files an export for a task copies from the model directory into the artifact (hashed in its
# manifest like every file), so that `hfexport generate DIR --prompt TEXT` finds its tokenizer there.
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
                    "vocab.json", "vocab.txt", "merges.txt", "tokenizer.model", "spiece.model",
                    "sentencepiece.bpe.model", "chat_template.jinja", "chat_template.json")
_TOKENIZER_MARKERS = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "spiece.model", "vocab.json",
                      "vocab.txt")


def _has_tokenizer(directory: Path) -> bool:
    return any((directory / name).is_file() for name in _TOKENIZER_MARKERS)


def _load_for_task(exporter_class: Any, path: str, task: str) -> Any:
    """The model of ``path`` as the backend's loader gives it (the class ``config.architectures`` names); a
    usage error when that class cannot generate (a base model would need a head the checkpoint lacks)."""
    model = exporter_class.load_model(path)
    from transformers import GenerationMixin

    if not isinstance(model, GenerationMixin):
        architectures = getattr(getattr(model, "config", None), "architectures", None)
        named = (f"config.architectures names {', '.join(architectures)}" if architectures else
                 "its config.json names no architectures, so it loads as " + type(model).__name__)
        raise UsageError(f"{path} holds a model without a generation head ({named}): task {task!r} needs a model "
                         "directory saved from a class that generates (a ...ForCausalLM for text-generation, "
                         "a ...ForConditionalGeneration for the encoder-decoder tasks), whose config.json names it "
                         "in \"architectures\"")
    return model


def _export_task(args: argparse.Namespace, exporter_class: Any, output: Path, console: Any) -> int:
    """``export MODEL --task T``: export the task's programs, save, load back, compare greedy generation."""
    from ._exporter import InvalidInputError

    start = time.perf_counter()
    model = _load_for_task(exporter_class, args.model, args.task)
    options = {name: value for name, value in (("max_cache_len", args.max_cache_len), ("max_batch", args.max_batch),
                                               ("prefill_chunk", args.prefill_chunk)) if value is not None}
    console.print(f"exporting {type(model).__name__} from {args.model} with backend {args.backend!r} for task "
                  f"{args.task!r}")
    progress = _Progress(console)
    try:
        exported = _exporter(exporter_class, args).export(model, None, progress=progress, task=args.task,
                                                          verify=not args.no_verify, atol=args.atol, rtol=args.rtol,
                                                          **options)  # each program verified
    except (ValueError, InvalidInputError) as exc:  # an unknown task, bounds the model refuses, no head
        raise UsageError(str(exc)) from exc  # (a failed stage is an ExportError: exit 1)
    finally:
        progress.stop()
    source = Path(args.model)
    for name in _TOKENIZER_FILES:
        if (source / name).is_file() and name not in exported.extra_files:
            exported.extra_files[name] = lambda d, f=source / name: _copy_into(f, d)
    path = exported.save_pretrained(output, overwrite=args.overwrite)
    bounds = exported.manifest.get("generation", {})
    console.print(f"saved to {path} ({', '.join(exported.manifest['components'])}; max_cache_len "
                  f"{bounds.get('max_cache_len')}, max_batch {bounds.get('max_batch')}) in "
                  f"{time.perf_counter() - start:.1f}s")
    if args.no_verify:
        return 0
    from ._api import load

    reloaded = load(path)
    check = _generation_check(model, reloaded)
    console.print(f"verifying the artifact loaded back from disk by greedy generation at {check['shapes']}")
    print(check["text"])
    from ._artifact import MANIFEST_NAME
    from ._saving import update_manifest

    exported.manifest = update_manifest(path, MANIFEST_NAME, {"verification": check["report"]})
    if args.report:
        _write_report(Path(args.report), args, exported, progress.lines, check["text"], check["shapes"])
    return EXIT_OK if check["report"]["passed"] else EXIT_MISMATCH


def _copy_into(source: Path, directory: Path) -> None:
    import shutil

    shutil.copyfile(source, directory / source.name)


def _generation_check(model: Any, exported: Any, max_new_tokens: int = 8) -> dict[str, Any]:
    """Greedy generation of ``exported`` (loaded from disk) against eager ``model.generate(do_sample=False)``
    on a seeded prompt: a batch of two (the first row left-padded) where the export's bounds allow it.

    Returns ``{"passed", "text" (what to print), "shapes", "report" (for the manifest)}``.
    """
    import torch

    section = exported.manifest["generation"]
    batch = min(2, section["max_batch"])
    generator = torch.Generator().manual_seed(0)
    features = _example_features(exported, batch, generator)
    config = model.generation_config
    eos = config.eos_token_id if isinstance(config.eos_token_id, int) else (config.eos_token_id or [None])[0]
    pad = config.pad_token_id if config.pad_token_id is not None else (eos if eos is not None else 0)
    if features is not None:  # speech: the encoder takes input_features
        prompt, new = {"input_features": features}, max_new_tokens
        ours = exported.generate(features, max_new_tokens=new, pad_token_id=pad)
    else:
        length = 5
        new = max(1, min(max_new_tokens, section["max_cache_len"] - length))
        vocab = section["vocab_size"]
        ids = torch.randint(3 if vocab > 3 else 0, vocab, (batch, length), generator=generator)
        mask = torch.ones_like(ids)
        if batch > 1:
            ids[0, :2], mask[0, :2] = pad, 0
        prompt = {"input_ids": ids, "attention_mask": mask}
        ours = exported.generate(ids, mask, max_new_tokens=new, pad_token_id=pad)
    stats = dict(exported.generation_stats)
    with torch.no_grad():
        eager = model.generate(**prompt, do_sample=False, num_beams=1, max_new_tokens=new, pad_token_id=pad)
    eager = getattr(eager, "sequences", eager)
    shapes = ", ".join(f"{k}={list(v.shape)}" for k, v in prompt.items()) + f", max_new_tokens={new}"
    difference = _first_difference(ours, eager)
    where = f"{type(model).__name__}.generate(do_sample=False)"
    if difference is None:
        text = (f"PASSED: token ids equal eager {where}: {ours.shape[0]} x {ours.shape[1]}"
                f"{' (row 0 left-padded by 2)' if features is None and batch > 1 else ''}")
    else:
        text = f"FAILED: token ids differ from eager {where}: {difference}"
        for name, rows in (("exported", ours), ("eager   ", eager)):
            text += "".join(f"\n  {name} row {r}: {' '.join(map(str, row))}" for r, row in enumerate(rows.tolist()))
    text += "\n" + _stats_text(stats, ours.shape[0])
    report = {"kind": "generation", "passed": difference is None, "inputs": {k: list(v.shape) for k, v in
                                                                              prompt.items()},
              "max_new_tokens": new, "pad_token_id": pad, "sequences_shape": list(ours.shape),
              "first_difference": difference, "reference": where}
    return {"text": text, "shapes": shapes, "report": report}


def _example_features(exported: Any, batch: int, generator: Any) -> Any:
    """Seeded ``input_features`` for an artifact whose encoder takes them (speech), at its traced shape; else None."""
    import torch

    for section in (exported.manifest.get("components") or {}).values():
        for spec in section.get("inputs", []):
            if spec.get("name") == "input_features" and spec.get("example_shape"):
                return torch.randn(batch, *spec["example_shape"][1:], generator=generator)
    return None


def _first_difference(ours: Any, eager: Any) -> str | None:
    """Where two ``[batch, length]`` id tensors first differ, in words; None when they are equal."""
    if ours.shape == eager.shape and bool((ours == eager).all()):
        return None
    if ours.shape[0] != eager.shape[0]:
        return f"{ours.shape[0]} rows, eager {eager.shape[0]}"
    for r, (a, b) in enumerate(zip(ours.tolist(), eager.tolist(), strict=True)):
        for i, (x, y) in enumerate(zip(a, b, strict=False)):
            if x != y:
                return f"row {r}, position {i}: {x}, eager {y}"
    return f"{ours.shape[1]} positions, eager {eager.shape[1]} (equal where both have one)"


def _stats_text(stats: dict[str, Any], batch: int) -> str:
    """``prefill 4.3 ms, decode 7 steps (batch 2) 959.3 tokens/s``: the timings of ExportedModel.generate."""
    text = f"prefill {stats.get('prefill_s', float('nan')) * 1e3:.2f} ms"
    steps = stats.get("decode_steps", 0)
    if steps:
        text += (f", decode {steps} step{'s' if steps != 1 else ''} x batch {batch} in "
                 f"{stats['decode_s'] * 1e3:.2f} ms: {stats['decode_tokens_per_s']:.1f} tokens/s")
    else:
        text += ", decode: no steps (the prefill gave the only new token)"
    return text


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
    parser.add_argument("--debug", action="store_true",
                        help="on an error, show the full traceback (every command; errors are one line without it)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    p = sub.add_parser("export", help="export a model directory (or the demo model), save it and verify it",
                       formatter_class=argparse.RawDescriptionHelpFormatter, epilog=EPILOG)
    p.add_argument("model", nargs="?", help="a local Transformers model directory (config.json + weights)")
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
    p.add_argument("--task", help="export the programs a task runs instead of one forward pass: text-generation "
                                  "(a decoder: one program for prefill and decode, its weights stored once, over a "
                                  "KV cache of --max-cache-len positions, written in place on ONNX Runtime and "
                                  "ExecuTorch; a prompt is prefilled in chunks of --prefill-chunk tokens), "
                                  "text2text-generation, automatic-speech-recognition (encoder-decoders: encoder, "
                                  "prefill and decode programs); verified by greedy "
                                  "generation against eager model.generate. Run it with `hfexport generate`")
    p.add_argument("--max-cache-len", type=int, metavar="N",
                   help="with --task: the most tokens a sequence may hold, prompt and new ones: the KV cache's "
                        "capacity (default: max_position_embeddings, capped at 4096 and at a sliding window; "
                        "capped at 256 for the encoder-decoder tasks)")
    p.add_argument("--max-batch", type=int, metavar="N", help="with --task: the largest batch (default 1; on "
                   "ExecuTorch a decoder's batch is static: every call runs this many rows)")
    p.add_argument("--prefill-chunk", type=int, metavar="N", help="with --task text-generation: the most prompt "
                   "tokens one call takes (default min(256, max-cache-len)); a longer prompt is prefilled in chunks. "
                   "ExecuTorch plans max-batch x N x max-cache-len attention scores")
    p.add_argument("--quantize", metavar="RECIPE", help="quantize with a recipe of the backend (onnx: int8-dynamic, "
                   "int4, int8-dynamic-per-tensor, int8-static; executorch-xnnpack: 8da4w, 8da8w, int8, int8-dynamic); "
                   "verified against float eager by cosine similarity")
    p.set_defaults(func=_cmd_export, demo=None)

    p = sub.add_parser("generate", help="generate token ids greedily with a task export (`export --task`) on its "
                                        "runtime; prints ids, text, prefill latency and decode tokens/s",
                       formatter_class=argparse.RawDescriptionHelpFormatter, epilog=GENERATE_EPILOG,
                       description="Load a task export (a directory, or a Hub repository id) and generate greedily "
                                   "from a prompt given as token ids or as text.")
    p.add_argument("artifact", help="the artifact directory (holds export.json), or a Hub repository id org/name")
    p.add_argument("--input-ids", action="append", metavar="IDS",
                   help="the prompt as comma-separated token ids (1,2,3); repeat for a batch: shorter prompts are "
                        "left-padded (with --pad-token-id) and masked")
    p.add_argument("--prompt", action="append", metavar="TEXT",
                   help="the prompt as text (repeat for a batch), tokenized by --tokenizer's tokenizer")
    p.add_argument("--max-new-tokens", type=int, metavar="N", help="the number of tokens to generate (required)")
    p.add_argument("--eos-token-id", metavar="ID",
                   help="the id(s) that end a row, comma-separated (default: the model's generation config)")
    p.add_argument("--pad-token-id", type=int, metavar="ID",
                   help="the id after a row's EOS and of the prompt's left padding (default: the generation "
                        "config's pad, else its first EOS)")
    p.add_argument("--tokenizer", metavar="DIR",
                   help="a directory with the tokenizer (the exported model's); default: the artifact directory "
                        "when it holds tokenizer files (`export --task` copies the model directory's)")
    p.add_argument("--revision", help="with a Hub repository id: the branch, tag or commit (default main)")
    p.add_argument("--subfolder", help="the artifact's folder in the repository or directory (push_to_hub's "
                                       "default is hfexport/<backend>)")
    p.add_argument("--trust-remote-code", action="store_true",
                   help="allow what loading refuses by default (see `hfexport verify --help`): only for an "
                        "artifact from a source you trust")
    p.add_argument("--json", action="store_true",
                   help="print {sequences, prompt_length, texts, stats} as JSON instead")
    p.set_defaults(func=_cmd_generate)

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

    logger, handler = logging.getLogger("hfexport"), _Line(logging.WARNING)
    logger.addHandler(handler)
    propagate, logger.propagate = logger.propagate, False
    warnings.showwarning = show
    try:
        yield
    finally:
        warnings.showwarning = original
        logger.removeHandler(handler)
        logger.propagate = propagate


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
