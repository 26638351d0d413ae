"""The generation commands of the CLI (``hfexport.commands`` entry point): ``hfexport export MODEL --task ...`` and
``hfexport generate DIR``.

A task export loads a Transformers model that generates, exports the programs of its task, saves them with the
model directory's tokenizer files, loads the artifact back and checks its greedy generation token for token against
eager ``model.generate(do_sample=False)``. ``generate`` refuses from ``export.json`` alone what it can (an export
for one forward pass, a batch or a prompt beyond the bounds) before any runtime loads, then decodes greedily on the
artifact's runtime. Kept light: registering the commands imports neither torch nor transformers.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from hfexport.artifact import MANIFEST_NAME
from hfexport.commands import (
    EXIT_MISMATCH,
    EXIT_OK,
    Progress,
    UsageError,
    configured_exporter,
    load_model,
    quiet_third_party_logs,
    record_verification,
    resolve_artifact,
    timed,
    write_report,
)


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
            "decoder's batch is static: every call runs this many rows)")
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


def _parse_ids(text: str, flag: str) -> list[int]:
    """``"1,2,3"`` (or ``"1 2 3"``) as token ids; a usage error that names the bad item otherwise (an empty item,
    ``"1,,2"``, is a missing id, not a separator)."""
    items = [item for item in text.replace(",", " ").split() if item]
    if not items:
        raise UsageError(f"{flag} {text!r} holds no token ids: give comma-separated integers, e.g. {flag} 1,2,3")
    if any(not part.strip() for part in text.strip().strip(",").split(",")):
        raise UsageError(f"{flag} {text!r} has an empty item between commas: give one integer between each two "
                         f"commas, e.g. {flag} 1,2,3")
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
    from hfexport.artifact import read_manifest

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
    size = len(rows) or len(args.prompt or ())
    if isinstance(batch, int) and size > batch:
        flag = "--input-ids" if rows else "--prompt"
        raise UsageError(f"a batch of {size} exceeds this export's max_batch={batch}: give at most {batch} "
                         f"{flag}, or re-export with a larger --max-batch")
    images = len(getattr(args, "image", None) or ())
    most = (section.get("vision") or {}).get("max_images")
    if images and isinstance(most, int) and images > most:
        raise UsageError(f"{images} --image exceed this export's max_images={most}: give at most {most}, or "
                         "re-export with a larger --max-images")
    longest = max((len(r) for r in rows), default=0)
    if manifest["task"] == "text-generation" and longest and isinstance(cache, int) \
            and longest + args.max_new_tokens > cache:
        raise UsageError(f"a prompt of {longest} tokens plus max_new_tokens={args.max_new_tokens} exceeds this "
                         f"export's max_cache_len={cache}: give at most {cache - longest} new tokens, or re-export "
                         "with a larger --max-cache-len")


def _say_generating(directory: Path) -> None:
    """``generating with the onnx export of LlamaForCausalLM (text-generation, max_cache_len 32, max_batch 2) from
    DIR`` on stderr, from export.json alone."""
    from hfexport.artifact import read_manifest

    try:
        manifest = read_manifest(directory)
    except (OSError, ValueError):
        manifest = {}
    bounds = manifest.get("generation") or {}
    print(f"generating with the {manifest.get('backend')} export of {manifest.get('model_class')} "
          f"({manifest.get('task')}, max_cache_len {bounds.get('max_cache_len')}, max_batch {bounds.get('max_batch')})"
          f" from {directory}", file=sys.stderr, flush=True)


def _quick_token_rows(directory: Path | None, prompts: list[str]) -> list[list[int]]:
    """The token ids of ``prompts`` by ``directory``'s ``tokenizer.json`` with the ``tokenizers`` library alone
    (special tokens added as its post-processor says), for the bounds check before the runtime and transformers
    load; ``[]`` where there is no tokenizer.json or it does not read (the check after tokenizing still runs)."""
    path = directory / "tokenizer.json" if directory is not None else None
    if path is None or not path.is_file():
        return []
    try:
        from tokenizers import Tokenizer

        tokenizer = Tokenizer.from_file(str(path))
        return [tokenizer.encode(text).ids for text in prompts]
    except Exception:  # noqa: BLE001 - an early check only: transformers' tokenizer decides
        return []


def _cmd_generate(args: argparse.Namespace) -> int:
    if bool(args.input_ids) == bool(args.prompt):
        raise UsageError("give the prompt as token ids (--input-ids 1,2,3; repeat it for a batch) or as text "
                         f"(--prompt TEXT, with a tokenizer), {'not both' if args.input_ids else 'one of them'}")
    if args.max_new_tokens is None:
        raise UsageError("pass --max-new-tokens N (the number of tokens to generate)")
    if args.max_new_tokens < 1:
        raise UsageError(f"--max-new-tokens must be 1 or more, got {args.max_new_tokens}")
    rows = [_parse_ids(text, "--input-ids") for text in args.input_ids or ()]
    eos = _parse_ids(args.eos_token_id, "--eos-token-id") if args.eos_token_id is not None else None
    images = list(getattr(args, "image", None) or ())
    audios = list(getattr(args, "audio", None) or ())
    if audios:
        if not args.prompt or images:
            raise UsageError("--audio needs the prompt as text (--prompt TEXT, one per --audio) and no --image")
        missing = [path for path in audios if not Path(path).is_file()]
        if missing:
            raise UsageError(f"--audio {missing[0]} is not a file: give the path of a PCM WAV file")
        if len(audios) != len(args.prompt):
            raise UsageError(f"{len(audios)} --audio for {len(args.prompt)} --prompt: give one audio per prompt")
    if images:
        if not args.prompt:
            raise UsageError("--image needs the prompt as text (--prompt TEXT): the model's processor puts the "
                             "image tokens into it")
        missing = [path for path in images if not Path(path).is_file()]
        if missing:
            raise UsageError(f"--image {missing[0]} is not a file: give the path of an image (PNG, JPEG, ...)")
        if len(args.prompt) > 1 and len(images) != len(args.prompt):
            raise UsageError(f"{len(images)} --image for {len(args.prompt)} --prompt: with several prompts give one "
                             "image each (with one prompt, every image goes to it)")
    if args.tokenizer is not None:
        if not Path(args.tokenizer).is_dir():
            raise UsageError(f"--tokenizer {args.tokenizer} is not a directory: give the exported model's directory "
                             "(it holds tokenizer.json or tokenizer_config.json)")
        if not _has_tokenizer(Path(args.tokenizer)):
            raise UsageError(f"--tokenizer {args.tokenizer} holds no tokenizer files ({', '.join(_TOKENIZER_MARKERS)})")
    artifact = resolve_artifact(args.artifact, args.revision, args.subfolder)
    directory = Path(artifact)
    if not directory.is_dir():
        raise UsageError(f"{artifact} is not a directory: give the directory of a saved export (`hfexport export "
                         "MODEL --task text-generation -o DIR` writes one), or a Hub repository id (org/name)")
    if not (directory / MANIFEST_NAME).is_file():
        raise UsageError(f"{artifact} holds no {MANIFEST_NAME}: give the directory of a saved export (`hfexport "
                         "export MODEL --task text-generation -o DIR` writes one)")
    _check_generation_bounds(directory, args, rows)  # from export.json, before any runtime loads
    tokenizer_dir = Path(args.tokenizer) if args.tokenizer else directory if _has_tokenizer(directory) else None
    if args.prompt and tokenizer_dir is None:
        raise UsageError(f"--prompt needs a tokenizer, and {args.artifact} holds no tokenizer files: pass --tokenizer "
                         "DIR (the exported model's directory), or the prompt as token ids with --input-ids 1,2,3")
    if args.prompt and not images:  # the prompts' lengths by the tokenizer.json alone (no transformers import)
        _check_generation_bounds(directory, args, _quick_token_rows(tokenizer_dir, args.prompt))
    _say_generating(directory)  # the first line, before transformers and the runtime load
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    quiet_third_party_logs()
    from hfexport import load

    with timed("loading the artifact and its runtime"):
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
    if images and task != "image-text-to-text":
        raise UsageError(f"--image needs an image-text-to-text export, and {args.artifact} was exported for task "
                         f"{task!r}: export the vision-language model with --task image-text-to-text")
    audios = list(getattr(args, "audio", None) or ())
    if audios and task != "audio-text-to-text":
        raise UsageError(f"--audio needs an audio-text-to-text export, and {args.artifact} was exported for task "
                         f"{task!r}: export the audio-language model with --task audio-text-to-text")
    tokenizer = None
    media: dict[str, Any] = {}
    if audios:
        tokenizer, input_ids, attention_mask, media = _audio_prompts(tokenizer_dir, args.prompt, audios, bounds,
                                                                     args.pad_token_id, bool(args.trust_remote_code))
    elif images:
        tokenizer, input_ids, attention_mask, media = _image_prompts(tokenizer_dir, args.prompt, images, bounds,
                                                                     bool(args.trust_remote_code))
    else:
        if tokenizer_dir is not None:
            from transformers import AutoTokenizer

            check_configs_run_no_code(tokenizer_dir, args.trust_remote_code)
            tokenizer = _tokenizer_call(lambda: AutoTokenizer.from_pretrained(
                tokenizer_dir, trust_remote_code=bool(args.trust_remote_code)), tokenizer_dir, "load")
        if args.prompt:
            rows = [list(_tokenizer_call(lambda text=text: tokenizer(text)["input_ids"], tokenizer_dir, "tokenize"))
                    for text in args.prompt]
            empty = [text for text, ids in zip(args.prompt, rows, strict=True) if not ids]
            if empty:
                raise UsageError(f"--prompt {empty[0]!r} gives no tokens: give some text")
        input_ids, attention_mask = _left_pad(rows, _prompt_pad_id(args.pad_token_id, tokenizer, bounds))
    options: dict[str, Any] = {"max_new_tokens": args.max_new_tokens}
    if eos is not None:
        options["eos_token_id"] = eos[0] if len(eos) == 1 else eos
    if args.pad_token_id is not None:
        options["pad_token_id"] = args.pad_token_id
    try:
        sequences = exported.generate(input_ids, attention_mask, **options, **media)
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


def _image_prompts(directory: Path, prompts: list[str], images: list[str], bounds: dict[str, Any],
                   trust_remote_code: bool = False) -> tuple[Any, Any, Any, dict[str, Any]]:
    """``(tokenizer, input_ids, attention_mask, {"pixel_values": ..., ...})`` of ``prompts`` with ``images`` (read
    with Pillow), as the model's own processor (``AutoProcessor`` over the artifact's copied processor files, no code
    from them) makes them, left-padded. With one prompt every image goes to it, else one each; a prompt without
    the processor's image token gets one per image in front."""
    if not any((directory / name).is_file() for name in _PROCESSOR_FILES):
        raise UsageError(f"--image needs the model's processor, and {directory} holds no {' or '.join(_PROCESSOR_FILES)}:"
                         " export from a model directory that holds them (`export --task image-text-to-text` copies "
                         "them), or pass --tokenizer DIR (that directory)")
    try:
        from PIL import Image, UnidentifiedImageError
    except ImportError as exc:
        raise UsageError("--image reads images with Pillow: pip install 'hfexport-dynamo[vision]'") from exc
    from transformers import AutoProcessor

    check_configs_run_no_code(directory, trust_remote_code)
    processor = _tokenizer_call(lambda: AutoProcessor.from_pretrained(directory, trust_remote_code=trust_remote_code),
                                directory, "load")
    processor.tokenizer.padding_side = "left"
    pictures = []
    for path in images:
        try:
            with Image.open(path) as image:
                pictures.append(image.convert("RGB"))
        except (UnidentifiedImageError, OSError) as exc:
            raise UsageError(f"--image {path} does not read as an image: {exc}") from exc
    check_resize_bound(getattr(processor, "image_processor", None), [p.size for p in pictures], directory)
    groups = [pictures] if len(prompts) == 1 else [[picture] for picture in pictures]
    token = getattr(processor, "image_token", None)
    texts = [text if token is None or token in text else f"{token * len(group)} {text}"
             for text, group in zip(prompts, groups, strict=True)]
    batch = processor(text=texts, images=groups, return_tensors="pt", padding=True)
    vision = bounds.get("vision") or {}
    media = {name: batch[name] for name in vision.get("inputs", ("pixel_values",)) if name in batch}
    return processor.tokenizer, batch["input_ids"], batch["attention_mask"], media


# Config files of a tokenizer or processor that transformers reads from the artifact's directory.
_CONFIG_FILES = ("config.json", "tokenizer_config.json", "processor_config.json", "preprocessor_config.json",
                 "image_processor_config.json", "video_preprocessor_config.json", "feature_extractor_config.json")
# keys that name a class transformers would look up (a custom one is the artifact's own Python)
_CLASS_KEYS = ("tokenizer_class", "processor_class", "image_processor_type", "feature_extractor_type",
               "video_processor_type")
IMAGE_MAX_PIXELS = 2**24  # a processor may resize an image to at most 4,096 x 4,096 (float32 RGB: 192 MiB)


def check_configs_run_no_code(directory: Path, trust_remote_code: bool = False) -> None:
    """Refuse, unless ``trust_remote_code``, a tokenizer or processor config of ``directory`` that would make
    transformers run the artifact's own Python: an ``auto_map`` (``AutoTokenizer``/``AutoProcessor`` import the
    module it names, after asking on standard input), or a class name (``tokenizer_class``, ``processor_class``,
    ``image_processor_type``, ...) that transformers does not define. Every ``from_pretrained`` on artifact files
    also passes ``trust_remote_code=False``, so transformers itself refuses rather than prompts.

    Raises:
        UsageError: the file, the key and the name; and that ``--trust-remote-code`` allows it.
    """
    if trust_remote_code:
        return
    import transformers

    for name in _CONFIG_FILES:
        file = Path(directory) / name
        if not file.is_file():
            continue
        if file.stat().st_size > 2**22:
            raise UsageError(f"{file} is {file.stat().st_size:,} bytes, over the 4 MiB a config may have: the "
                             "artifact is damaged or crafted")
        try:  # json, not parse_json: tokenizer configs hold 31-digit ints (model_max_length = 1e30); size-bounded
            config = json.loads(file.read_bytes())
        except RecursionError:
            raise UsageError(f"{file} is JSON nested too deeply for Python: the artifact is damaged or "
                             "crafted") from None
        except ValueError as exc:
            raise UsageError(f"{file} is not JSON hfexport reads ({exc}): the artifact is damaged or crafted") from None
        if not isinstance(config, dict):
            continue
        found = [(f"{name}:auto_map", config["auto_map"])] if "auto_map" in config else []
        for key in _CLASS_KEYS:
            value = config.get(key)
            if value is not None and not (isinstance(value, str) and value.isidentifier()
                                          and isinstance(getattr(transformers, value, None), type)):
                found.append((f"{name}:{key}", value))
        if found:
            where, value = found[0]
            raise UsageError(f"{where} names {value!r:.120}, code of the artifact's own (transformers defines no "
                             "such class): hfexport runs no code from an artifact; pass --trust-remote-code only "
                             "for an artifact from a source you trust")


def _tokenizer_call(call: Any, directory: Path, what: str) -> Any:
    """``call()``, with a panic of the Rust tokenizers library (``pyo3_runtime.PanicException``, a
    ``BaseException``: a crafted ``tokenizer.json``, a catastrophic regex) turned into an error that names the
    files."""
    try:
        return call()
    except Exception as exc:
        if what == "load":
            raise UsageError(f"the tokenizer or processor files of {directory} do not load ({type(exc).__name__}: "
                             f"{str(exc)[:200]}): the artifact is damaged or crafted") from None
        raise
    except BaseException as exc:
        if type(exc).__name__ != "PanicException":
            raise
        raise UsageError(f"the tokenizer of {directory} failed to {what} ({str(exc)[:200]}): its tokenizer.json is "
                         "damaged or crafted; give another with --tokenizer DIR, or the prompt as --input-ids") from None


def check_resize_bound(image_processor: Any, sizes: list[tuple[int, int]], directory: Path) -> None:
    """Refuse, before the processor runs, an image processor config that resizes an image past
    :data:`IMAGE_MAX_PIXELS` (a crafted ``size`` of 12,000 px grew the process by 5.5 GiB in 112 s): the fixed
    target sizes it names (``size``: ``height`` x ``width``, ``shortest_edge`` / ``longest_edge``, ``crop_size``),
    the least it upscales to (``min_pixels``), and what ``shortest_edge`` makes of the given images' aspect ratios.

    Raises:
        UsageError: the key, the pixels it asks for, and the bound.
    """
    if image_processor is None:
        return
    widest = max((max(w, h) / max(1, min(w, h)) for w, h in sizes), default=1.0)
    targets: list[tuple[str, float]] = []
    for key in ("size", "crop_size"):
        size = getattr(image_processor, key, None)
        if isinstance(size, int) and not isinstance(size, bool):
            size = {"height": size, "width": size}
        elif not isinstance(size, dict):  # transformers' SizeDict: attributes
            size = {k: getattr(size, k, None) for k in ("height", "width", "shortest_edge", "longest_edge",
                                                        "min_pixels", "max_pixels")}
        numbers = {k: v for k, v in size.items() if isinstance(v, int | float) and not isinstance(v, bool)}
        if "height" in numbers and "width" in numbers:
            targets.append((f"{key}.height x {key}.width", numbers["height"] * numbers["width"]))
        if "shortest_edge" in numbers:
            longest = numbers.get("longest_edge", numbers["shortest_edge"] * widest)
            targets.append((f"{key}.shortest_edge", numbers["shortest_edge"] * longest))
        elif "longest_edge" in numbers:
            targets.append((f"{key}.longest_edge", numbers["longest_edge"] ** 2))
        if "min_pixels" in numbers:  # max_pixels only shrinks an image; min_pixels grows a small one
            targets.append((f"{key}.min_pixels", numbers["min_pixels"]))
    least = getattr(image_processor, "min_pixels", None)
    if isinstance(least, int | float) and not isinstance(least, bool):
        targets.append(("min_pixels", least))
    for where, pixels in targets:
        if pixels > IMAGE_MAX_PIXELS:
            raise UsageError(f"the image processor of {directory} resizes images to {int(pixels):,} pixels "
                             f"({where}), over the bound of {IMAGE_MAX_PIXELS:,} (hfexport_dynamo.tasks.cli."
                             "IMAGE_MAX_PIXELS): the artifact is damaged or crafted")


def _read_wav(path: str) -> tuple[Any, int]:
    """``(float32 samples in [-1, 1], sampling rate)`` of a PCM WAV file (channels averaged), by the standard
    library's ``wave``."""
    import wave

    import numpy as np

    try:
        with wave.open(path, "rb") as wav:
            rate, width, channels = wav.getframerate(), wav.getsampwidth(), wav.getnchannels()
            frames = wav.readframes(wav.getnframes())
    except (wave.Error, EOFError, OSError) as exc:
        raise UsageError(f"--audio {path} does not read as a PCM WAV file: {exc}") from exc
    kinds = {1: (np.uint8, 128.0, 128.0), 2: (np.int16, 0.0, 32768.0), 4: (np.int32, 0.0, 2147483648.0)}
    if width not in kinds:
        raise UsageError(f"--audio {path} holds {8 * width}-bit samples: give 8-, 16- or 32-bit PCM")
    kind, offset, scale = kinds[width]
    samples = (np.frombuffer(frames, dtype=kind).astype(np.float32) - offset) / scale
    return samples.reshape(-1, channels).mean(axis=1), rate


def _audio_prompts(directory: Path, prompts: list[str], audios: list[str], bounds: dict[str, Any],
                   pad_token_id: int | None, trust_remote_code: bool = False) -> tuple[Any, Any, Any, dict[str, Any]]:
    """``(tokenizer, input_ids, attention_mask, {"input_features": [chunks, mels, frames]})`` of ``prompts`` with one
    audio each: each audio cut into chunks of the export's length, the model's feature extractor (the artifact's
    ``preprocessor_config.json``) making each chunk's log-mel features, and ``chunks x tokens_per_chunk`` audio
    tokens put in front of the prompt's text (after its BOS), left-padded."""
    if not (directory / "preprocessor_config.json").is_file():
        raise UsageError(f"--audio needs the model's feature extractor, and {directory} holds no "
                         "preprocessor_config.json: export from a model directory that holds it, or pass --tokenizer "
                         "DIR (that directory)")
    from transformers import AutoFeatureExtractor, AutoTokenizer

    check_configs_run_no_code(directory, trust_remote_code)
    extractor = _tokenizer_call(lambda: AutoFeatureExtractor.from_pretrained(directory,
                                                                             trust_remote_code=trust_remote_code),
                                directory, "load")
    tokenizer = _tokenizer_call(lambda: AutoTokenizer.from_pretrained(directory, trust_remote_code=trust_remote_code),
                                directory, "load")
    audio = bounds["audio"]
    token, per_chunk = audio["audio_token_id"], audio["tokens_per_chunk"]
    length = int(getattr(extractor, "n_samples", 0)) or int(extractor.chunk_length * extractor.sampling_rate)
    rows, chunks = [], []
    for text, path in zip(prompts, audios, strict=True):
        samples, rate = _read_wav(path)
        if rate != extractor.sampling_rate:
            raise UsageError(f"--audio {path} is sampled at {rate} Hz; the model's feature extractor takes "
                             f"{extractor.sampling_rate} Hz: resample it first")
        pieces = [samples[i:i + length] for i in range(0, max(len(samples), 1), length)]
        chunks += pieces
        ids = list(tokenizer(text)["input_ids"])
        at = 1 if ids and ids[0] == tokenizer.bos_token_id else 0
        rows.append(ids[:at] + [token] * (len(pieces) * per_chunk) + ids[at:])
    features = extractor(chunks, sampling_rate=extractor.sampling_rate, return_tensors="pt", padding="max_length",
                         max_length=length)["input_features"]
    input_ids, attention_mask = _left_pad(rows, _prompt_pad_id(pad_token_id, tokenizer, bounds))
    if attention_mask is None:
        import torch

        attention_mask = torch.ones_like(input_ids)
    return tokenizer, input_ids, attention_mask, {"input_features": features}


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


# The tokenizer files an export for a task copies from the model directory into the artifact (hashed in its
# manifest like every file), so that `hfexport generate DIR --prompt TEXT` finds its tokenizer there.
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
                    "vocab.json", "vocab.txt", "merges.txt", "tokenizer.model", "spiece.model",
                    "sentencepiece.bpe.model", "chat_template.jinja", "chat_template.json")


# and the processor's, for `hfexport generate DIR --image PATH` (image-text-to-text)
_PROCESSOR_FILES = ("processor_config.json", "preprocessor_config.json")


_TOKENIZER_MARKERS = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "spiece.model", "vocab.json",
                      "vocab.txt")


def _has_tokenizer(directory: Path) -> bool:
    return any((directory / name).is_file() for name in _TOKENIZER_MARKERS)


def _load_for_task(exporter_class: Any, args: argparse.Namespace) -> Any:
    """The model of ``args.model`` as the backend's loader gives it (the class ``config.architectures`` names,
    with ``--dtype`` and ``--trust-remote-code``); a usage error when that class cannot generate (a base model would
    need a head the checkpoint lacks)."""
    path, task = args.model, args.task
    model = load_model(exporter_class, args)
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
    from hfexport import InvalidInputError

    start = time.perf_counter()
    with timed("loading the model"):
        model = _load_for_task(exporter_class, args)
    options = {name: value for name, value in (("max_cache_len", args.max_cache_len), ("max_batch", args.max_batch),
                                               ("prefill_chunk", args.prefill_chunk),
                                               ("max_images", getattr(args, "max_images", None)))
               if value is not None}
    try:
        task_options = exporter_class.tracer.task_options(args.task)(**options)
    except (ValueError, TypeError) as exc:  # an unknown task, an option of another task or of the wrong type
        raise UsageError(str(exc)) from exc
    progress = Progress(console)
    # a backend that writes the tokenizer for its runtime (OpenVINO GenAI's tokenizer IR) takes the model's
    backend_options = {"tokenizer": str(args.model)} if _has_tokenizer(Path(args.model)) \
        and "tokenizer" in exporter_class.config_class.option_names() else {}
    try:
        exported = configured_exporter(exporter_class, args, **backend_options).export(model, None, progress=progress, task=args.task,
                                                                    task_options=task_options,
                                                                    verify=not args.no_verify, atol=args.atol,
                                                                    rtol=args.rtol)  # each program verified
    except (ValueError, InvalidInputError) as exc:  # an unknown task, bounds the model refuses, no head
        raise UsageError(str(exc)) from exc  # (a failed stage is an ExportError: exit 1)
    finally:
        progress.stop()
    source = Path(args.model)
    for name in (*_TOKENIZER_FILES, *_PROCESSOR_FILES):
        if (source / name).is_file() and name not in exported.extra_files:
            exported.extra_files[name] = lambda d, f=source / name: _copy_into(f, d)
    with timed(f"saving to {output}"):
        path = exported.save_pretrained(output, overwrite=args.overwrite)
    bounds = exported.manifest.get("generation", {})
    console.print(f"saved to {path} ({', '.join(exported.manifest['components'])}; max_cache_len "
                  f"{bounds.get('max_cache_len')}, max_batch {bounds.get('max_batch')}) in "
                  f"{time.perf_counter() - start:.1f}s", markup=False)
    if args.no_verify:
        return 0
    from hfexport import load

    with timed("loading the artifact back from disk"):
        reloaded = load(path)
    with timed("generating greedily with the artifact and with eager PyTorch"):
        check = _generation_check(model, reloaded)
    console.print(f"verifying the artifact loaded back from disk by greedy generation at {check['shapes']}",
                  markup=False)
    print(check["text"])
    exported.manifest = record_verification(path, check["report"])
    if args.report:
        write_report(Path(args.report), args, exported, progress.lines, check["text"], check["shapes"])
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
    features = None if section.get("audio") else _example_features(exported, batch, generator)
    config = model.generation_config
    eos = config.eos_token_id if isinstance(config.eos_token_id, int) else (config.eos_token_id or [None])[0]
    pad = config.pad_token_id if config.pad_token_id is not None else (eos if eos is not None else 0)
    vision = section.get("vision")
    if features is not None:  # speech: the encoder takes input_features
        prompt, new = {"input_features": features}, max_new_tokens
        ours = exported.generate(features, max_new_tokens=new, pad_token_id=pad)
    else:
        # image-text-to-text: one image per row, its image tokens after 3 text tokens
        audio = section.get("audio")  # audio-text-to-text: one chunk per row, its audio tokens after 3 text tokens
        if audio and audio["max_audio_chunks"] >= batch:
            vision = {"tokens_per_image": audio["tokens_per_chunk"], "max_images": audio["max_audio_chunks"],
                      "image_token_id": audio["audio_token_id"], "pixel_values_shape": audio["input_features_shape"],
                      "media_input": "input_features"}
        image_tokens = vision["tokens_per_image"] if vision and vision["max_images"] >= batch else 0
        length = 5 + image_tokens
        new = max(1, min(max_new_tokens, section["max_cache_len"] - length))
        vocab = section["vocab_size"]
        ids = torch.randint(3 if vocab > 3 else 0, vocab, (batch, length), generator=generator)
        mask = torch.ones_like(ids)
        media = {}
        if image_tokens:
            ids[ids == vision["image_token_id"]] = 3 if vision["image_token_id"] != 3 else 4
            ids[:, 3:3 + image_tokens] = vision["image_token_id"]
            shape = (batch, 1, *vision["pixel_values_shape"]) if vision.get("per_row") else \
                (batch, *vision["pixel_values_shape"])
            media[vision.get("media_input", "pixel_values")] = torch.randn(shape, generator=generator)
        if batch > 1:
            ids[0, :2], mask[0, :2] = pad, 0
        if image_tokens and vision.get("patches"):  # Qwen2-VL: the processor's packed patches, grid, token types
            media.update(pixel_values=media["pixel_values"].flatten(0, 1),
                         image_grid_thw=torch.tensor([vision["grid_thw"]] * batch),
                         mm_token_type_ids=(ids == vision["image_token_id"]).int())
        prompt = {"input_ids": ids, "attention_mask": mask, **media}
        ours = exported.generate(ids, mask, max_new_tokens=new, pad_token_id=pad, **media)
    stats = dict(exported.generation_stats)
    with torch.no_grad():
        eager = model.generate(**prompt, do_sample=False, num_beams=1, max_new_tokens=new, pad_token_id=pad)
    eager = getattr(eager, "sequences", eager)
    shapes = ", ".join(f"{k}={list(v.shape)}" for k, v in prompt.items()) + f", max_new_tokens={new}"
    difference = _first_difference(ours, eager)
    where = f"{type(model).__name__}.generate(do_sample=False)"
    recipes = sorted({str((c.get("quantization") or {}).get("recipe")) for c in
                      (exported.manifest.get("components") or {}).values() if c.get("quantization")})
    agreement = None
    if recipes:  # quantized: each program was checked by cosine against float eager; greedy ids may part early
        agreement = _token_agreement(ours, eager, ours.shape[1] - new)
    if recipes and difference is not None:
        text = (f"PASSED: a quantized export ({', '.join(recipes)}) is checked against float eager by each program's cosine "
                f"(export.json); its greedy ids are not expected to equal float eager's, and agree at "
                f"{agreement:.0%} of the new positions (first difference: {difference})")
    elif difference is None:
        text = (f"PASSED: token ids equal eager {where}: {ours.shape[0]} x {ours.shape[1]}"
                f"{' (row 0 left-padded by 2)' if features is None and batch > 1 else ''}")
    else:
        text = f"FAILED: token ids differ from eager {where}: {difference}"
        for name, rows in (("exported", ours), ("eager   ", eager)):
            text += "".join(f"\n  {name} row {r}: {' '.join(map(str, row))}" for r, row in enumerate(rows.tolist()))
    text += "\n" + _stats_text(stats, ours.shape[0])
    report = {"kind": "generation", "passed": difference is None or bool(recipes),
              "inputs": {k: list(v.shape) for k, v in prompt.items()},
              "max_new_tokens": new, "pad_token_id": pad, "sequences_shape": list(ours.shape),
              "first_difference": difference, "reference": where,
              **({"quantized": recipes, "token_agreement": round(agreement, 4)} if recipes else {})}
    return {"text": text, "shapes": shapes, "report": report}


def _example_features(exported: Any, batch: int, generator: Any) -> Any:
    """Seeded ``input_features`` for an artifact whose encoder takes them (speech), at its traced shape; else None."""
    import torch

    for section in (exported.manifest.get("components") or {}).values():
        for spec in section.get("inputs", []):
            if spec.get("name") == "input_features" and spec.get("example_shape"):
                return torch.randn(batch, *spec["example_shape"][1:], generator=generator)
    return None


def _token_agreement(ours: Any, eager: Any, start: int) -> float:
    """The share of the new positions (from ``start``) where two ``[batch, length]`` id tensors hold the same id."""
    length = min(ours.shape[1], eager.shape[1])
    if ours.shape[0] != eager.shape[0] or length <= start:
        return 0.0
    return float((ours[:, start:length] == eager[:, start:length]).float().mean())


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


def _check_task_options(args: argparse.Namespace, task: str | None, demo: Any) -> None:
    """Refuse the options that belong to a task export without ``--task``, and those a task export ignores."""
    bounds = [flag for flag, value in (("--max-cache-len", args.max_cache_len), ("--max-batch", args.max_batch),
                                       ("--prefill-chunk", args.prefill_chunk),
                                       ("--max-images", getattr(args, "max_images", None))) if value is not None]
    if task is not None and getattr(args, "no_task", False) and args.task is not None:
        raise UsageError(f"--no-task exports one forward pass: drop it or --task {task}")
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
    if args.prefill_chunk is not None and task not in ("text-generation", "image-text-to-text"):
        raise UsageError(f"--prefill-chunk bounds a decoder's prompt chunks (--task text-generation); --task {task} "
                         "exports an encoder-decoder, whose first decoder step takes the whole start sequence")
    max_images = getattr(args, "max_images", None)
    if max_images is not None and task != "image-text-to-text":
        raise UsageError(f"--max-images bounds the images of --task image-text-to-text, not of --task {task}")
    if max_images is not None and max_images < 1:
        raise UsageError(f"--max-images must be a positive number of images, got {max_images}")
