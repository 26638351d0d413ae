"""The generation commands of the CLI (``hfexport.commands`` entry point): ``hfexport export MODEL --task ...`` and
``hfexport generate DIR``.

A task export loads a Transformers model that generates, exports the programs of its task, saves them with the
model directory's tokenizer files, loads the artifact back and checks its greedy generation token for token against
eager ``model.generate(do_sample=False)``. ``generate`` refuses from ``export.json`` alone what it can (an export
for one forward pass, a batch or a prompt beyond the bounds) before any runtime loads, then decodes greedily on the
artifact's runtime. Kept light: registering the commands imports neither torch nor transformers.

This module registers the commands and their options; ``export --task`` runs in :mod:`.export_command`, ``generate``
in :mod:`.generate_command`, and both read tokenizer and processor files through :mod:`.tokenizer_files`.
"""

from __future__ import annotations

import argparse
from typing import Any

from hfexport.commands import UsageError

from .export_command import _export_task
from .generate_command import _cmd_generate


def register_cli(subparsers: argparse._SubParsersAction) -> None:
    """``hfexport.commands`` entry point: add ``--task`` and its bounds to the kernel's ``export``, and the
    ``generate`` command."""
    export = subparsers.choices.get("export")
    if export is not None:
        export.add_argument(
            "--task", help="export the programs a task runs instead of one forward pass: text-generation (a decoder: "
            "one program for prefill and decode, its weights stored once, over a KV cache of --max-cache-len "
            "positions, written in place on ONNX Runtime and ExecuTorch; a prompt is prefilled in chunks of "
            "--prefill-chunk tokens), text2text-generation, automatic-speech-recognition (encoder-decoders: encoder, "
            "prefill and decode programs), image-text-to-text (vision-language models: vision, embed and decoder "
            "programs, the image size the config's), audio-text-to-text (audio-language models: audio, embed and "
            "decoder programs); verified by greedy generation against eager model.generate. Run it with `hfexport "
            "generate`. Default: text-generation for a model whose config.json names a *ForCausalLM (--no-task: one "
            "forward pass), else one forward pass")
        export.add_argument(
            "--max-cache-len", type=int, metavar="N", help="with --task: the most tokens a sequence may hold, prompt "
            "and new ones: the KV cache's capacity (default: max_position_embeddings, capped at 4096 and at a "
            "sliding window; capped at 256 for the encoder-decoder tasks)")
        export.add_argument(
            "--max-batch", type=int, metavar="N", help="with --task: the largest batch (default 1; on ExecuTorch a "
            "decoder's batch is static: every call runs this many rows); with --dynamic on ExecuTorch: the batch's "
            "upper bound (ExecutorchConfig.max_batch)")
        export.add_argument(
            "--prefill-chunk", type=int, metavar="N", help="with --task text-generation or image-text-to-text: the "
            "most prompt tokens one call takes (default min(256, max-cache-len)); a longer prompt is prefilled in "
            "chunks. ExecuTorch plans max-batch x N x max-cache-len attention scores")
        export.add_argument(
            "--max-images", type=int, metavar="N", help="with --task image-text-to-text: the most images one "
            "generate call takes, the whole batch's (default: --max-batch)")
        export.add_argument(
            "--no-task", action="store_true", help="export one forward pass of a *ForCausalLM (which exports for "
            "--task text-generation by default)")
        export.set_defaults(check_task_options=_check_task_options, export_task=_export_task)

    p = subparsers.add_parser(
        "generate", formatter_class=argparse.RawDescriptionHelpFormatter, epilog=GENERATE_EPILOG,
        help="generate token ids greedily with a task export (`export --task`) on its runtime; prints ids, text, "
             "prefill latency and decode tokens/s",
        description="Load a task export (a directory, or a Hub repository id) and generate greedily from a prompt "
                    "given as token ids or as text.")
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
    p.add_argument("--audio", action="append", metavar="WAV",
                   help="an audio file (PCM WAV at the feature extractor's sampling rate) for an audio-text-to-text "
                        "export, with one --prompt per --audio: cut into the export's chunks, turned into log-mel "
                        "features by the model's feature extractor (the artifact's copied preprocessor_config.json), "
                        "its audio tokens put in front of the prompt's text")
    p.add_argument("--image", action="append", metavar="PATH",
                   help="an image for an image-text-to-text export (repeat it: with one --prompt, every image goes to "
                        "it; with several, one image each), read with Pillow and preprocessed by the model's own "
                        "processor from the artifact's copied processor files; the prompt gets the processor's image "
                        "token in front where it has none")
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
  # a vision-language model: the image through the model's own processor (copied into out/vlm by the export)
  hfexport export ./my-llava --task image-text-to-text -o out/vlm
  hfexport generate out/vlm --image cat.png --prompt "USER: <image> What is this? ASSISTANT:" --max-new-tokens 20
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


def _check_task_options(args: argparse.Namespace, task: str | None, demo: Any) -> None:
    """Refuse the options that belong to a task export without ``--task``, and those a task export ignores."""
    bounds = [flag for flag, value in (("--max-cache-len", args.max_cache_len), ("--max-batch", args.max_batch),
                                       ("--prefill-chunk", args.prefill_chunk),
                                       ("--max-images", getattr(args, "max_images", None))) if value is not None]
    if task is not None and getattr(args, "no_task", False) and args.task is not None:
        raise UsageError(f"--no-task exports one forward pass: drop it or --task {task}")
    if task is None:
        if args.dynamic and args.max_batch is not None:
            # a --dynamic export's batch bound: the backend's own max_batch option (ExecuTorch plans memory for it; a
            # backend without one refuses it by name)
            if args.max_batch < 1:
                raise UsageError(f"--max-batch must be a positive number of sequences, got {args.max_batch}")
            args.backend_options = {**(getattr(args, "backend_options", None) or {}), "max_batch": args.max_batch}
            bounds.remove("--max-batch")
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
    if args.prefill_chunk is not None and task not in ("text-generation", "image-text-to-text"):
        raise UsageError(f"--prefill-chunk bounds a decoder's prompt chunks (--task text-generation); --task {task} "
                         "exports an encoder-decoder, whose first decoder step takes the whole start sequence")
    max_images = getattr(args, "max_images", None)
    if max_images is not None and task != "image-text-to-text":
        raise UsageError(f"--max-images bounds the images of --task image-text-to-text, not of --task {task}")
    if max_images is not None and max_images < 1:
        raise UsageError(f"--max-images must be a positive number of images, got {max_images}")
