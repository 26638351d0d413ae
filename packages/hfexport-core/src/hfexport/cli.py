"""The ``hfexport`` command line: export, verify a saved artifact, list backends, stages and workarounds.

Kept light: ``hfexport --help`` and ``hfexport backends`` import neither torch nor any toolchain.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import sys
from collections.abc import Iterator
from importlib import metadata
from typing import Any

from ._export_command import _cmd_export
from ._inspect_commands import _cmd_backends, _cmd_stages, _cmd_verify, _cmd_workarounds
from .commands import (
    DTYPES,
    EXIT_ERROR,
    EXIT_MISMATCH,
    EXIT_USAGE,
    VERBOSE_ENV,
    UsageError,
    verbose,
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
    p.add_argument("--no-resource-check", action="store_true", help="export even when the estimated peak memory "
                   "(the weight bytes times the peak-to-weights ratio measured for the backend) or the artifact's "
                   "bytes exceed what this machine has (by default refused before the export starts; the line "
                   "'weights ...; estimated peak ...' gives the figures; HFEXPORT_AVAILABLE_MEMORY=24GB replaces "
                   "the memory read from the machine)")
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
    p.add_argument("--dtype", choices=tuple(DTYPES), help="load the model's weights in this dtype for the "
                   "export (default: float32, a bf16 or fp16 checkpoint widened exactly as it loads, so that CPU runtimes "
                   "compute in float32 and match eager token for token; export.json's source_dtype records the "
                   "checkpoint's dtype); verified against eager in that dtype, with atol and rtol 1e-2 (fp16) or 5e-2 "
                   "(bf16) unless --atol/--rtol")
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
