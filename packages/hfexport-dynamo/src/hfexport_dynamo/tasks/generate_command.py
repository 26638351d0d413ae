"""``hfexport generate DIR``: greedy generation with a task export on its runtime, from token ids or text (with
images or audio through the model's own processor). What it can refuse from ``export.json`` alone (an export for
one forward pass, a batch or a prompt beyond the export's bounds) it refuses before any runtime loads; the prompts
are left-padded and masked; it prints the token ids, the texts and the prefill and decode timings.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from pathlib import Path
from typing import Any

from hfexport.artifact import MANIFEST_NAME
from hfexport.commands import (
    EXIT_OK,
    UsageError,
    quiet_third_party_logs,
    resolve_artifact,
    timed,
)

from .tokenizer_files import (
    _PROCESSOR_FILES,
    _TOKENIZER_MARKERS,
    _has_tokenizer,
    _tokenizer_call,
    check_configs_run_no_code,
    check_resize_bound,
    check_tokenizer_expansion,
    checked_copy,
)


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
        fix = (f"give at most {cache - longest} new tokens" if longest < cache else  # never "at most -489"
               f"give a prompt of fewer than {cache} tokens")
        raise UsageError(f"a prompt of {longest} tokens plus max_new_tokens={args.max_new_tokens} exceeds this "
                         f"export's max_cache_len={cache}: {fix}, or re-export with a larger --max-cache-len")


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
    load; ``[]`` where there is no tokenizer.json or it does not read (the check after tokenizing still runs). Read
    by descriptor (``hfexport.trust.read_beneath``: no symlink, a regular file of at most 256 MiB) before ``load``'s
    check: it can only refuse early; the tokens generate runs come from the checked copy."""
    if directory is None or not (directory / "tokenizer.json").is_file():
        return []
    try:
        from tokenizers import Tokenizer

        from hfexport.trust import read_beneath

        tokenizer = Tokenizer.from_str(read_beneath(directory, "tokenizer.json", max_bytes=2**28).decode())
        check_tokenizer_expansion(tokenizer, directory)
        return [tokenizer.encode(text).ids for text in prompts]
    except UsageError:
        raise
    except Exception:  # noqa: BLE001 - an early check only: transformers' tokenizer decides
        return []
    except BaseException as exc:  # a panic of the Rust library: left to the tokenizer's own call, which names it
        if type(exc).__name__ != "PanicException":
            raise
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
    with _tokenizer_files(tokenizer_dir, directory, exported.manifest, bool(args.trust_remote_code)) as files:  # the artifact's: checked bytes
        if audios:
            tokenizer, input_ids, attention_mask, media = _audio_prompts(
                files, args.prompt, audios, bounds, args.pad_token_id, bool(args.trust_remote_code), tokenizer_dir)
        elif images:
            tokenizer, input_ids, attention_mask, media = _image_prompts(
                files, args.prompt, images, bounds, bool(args.trust_remote_code), tokenizer_dir)
        else:
            if files is not None:
                tokenizer = load_tokenizer(files, bool(args.trust_remote_code), tokenizer_dir)
            if args.prompt:
                rows = [list(_tokenizer_call(lambda text=text: tokenizer(text)["input_ids"], tokenizer_dir,
                                             "tokenize")) for text in args.prompt]
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


def _tokenizer_files(tokenizer_dir: Path | None, directory: Path, manifest: dict[str, Any],
                     trust_remote_code: bool = False) -> contextlib.AbstractContextManager[Path | None]:
    """The directory transformers reads the tokenizer and processor from: for the artifact's own, a private copy of
    the bytes its manifest hashes (:func:`.tokenizer_files.checked_copy`: nothing swapped in after ``load``'s check
    is read); a ``--tokenizer DIR`` of the user's as it is; None without one."""
    if tokenizer_dir is not None and os.path.samefile(tokenizer_dir, directory):
        return checked_copy(directory, manifest, trust_remote_code)
    return contextlib.nullcontext(tokenizer_dir)


def load_tokenizer(files: Path, trust_remote_code: bool = False, shown: Path | None = None) -> Any:
    """``AutoTokenizer`` over directory ``files`` (an artifact's :func:`.tokenizer_files.checked_copy`, or the user's
    ``--tokenizer DIR``), refusing configs that would run code (:func:`.tokenizer_files.check_configs_run_no_code`);
    errors name ``shown`` (the artifact), not a private copy."""
    from transformers import AutoTokenizer

    shown = shown or files
    check_configs_run_no_code(files, trust_remote_code, shown)
    tokenizer = _tokenizer_call(lambda: AutoTokenizer.from_pretrained(files, trust_remote_code=trust_remote_code),
                                shown, "load")
    check_tokenizer_expansion(getattr(tokenizer, "backend_tokenizer", None), shown)  # a fast one's: before encoding
    return tokenizer


def _image_prompts(directory: Path, prompts: list[str], images: list[str], bounds: dict[str, Any],
                   trust_remote_code: bool = False, shown: Path | None = None) -> tuple[Any, Any, Any, dict[str, Any]]:
    """``(tokenizer, input_ids, attention_mask, {"pixel_values": ..., ...})`` of ``prompts`` with ``images`` (read
    with Pillow), as the model's own processor (``AutoProcessor`` over the artifact's copied processor files, no code
    from them) makes them, left-padded. With one prompt every image goes to it, else one each; a prompt without
    the processor's image token gets one per image in front. ``directory`` is what transformers reads (the
    artifact's checked copy); errors name ``shown`` (the artifact)."""
    shown = shown or directory
    if not any((directory / name).is_file() for name in _PROCESSOR_FILES):
        raise UsageError(f"--image needs the model's processor, and {shown} holds no {' or '.join(_PROCESSOR_FILES)}:"
                         " export from a model directory that holds them (`export --task image-text-to-text` copies "
                         "them), or pass --tokenizer DIR (that directory)")
    try:
        from PIL import Image, UnidentifiedImageError
    except ImportError as exc:
        raise UsageError("--image reads images with Pillow: pip install 'hfexport-dynamo[vision]'") from exc
    from transformers import AutoProcessor

    check_configs_run_no_code(directory, trust_remote_code, shown)
    processor = _tokenizer_call(lambda: AutoProcessor.from_pretrained(directory, trust_remote_code=trust_remote_code),
                                shown, "load")
    check_tokenizer_expansion(getattr(processor.tokenizer, "backend_tokenizer", None), shown)
    processor.tokenizer.padding_side = "left"
    pictures = []
    for path in images:
        try:
            with Image.open(path) as image:
                pictures.append(image.convert("RGB"))
        except (UnidentifiedImageError, OSError) as exc:
            raise UsageError(f"--image {path} does not read as an image: {exc}") from exc
    check_resize_bound(getattr(processor, "image_processor", None), [p.size for p in pictures], shown)
    groups = [pictures] if len(prompts) == 1 else [[picture] for picture in pictures]
    token = getattr(processor, "image_token", None)
    texts = [text if token is None or token in text else f"{token * len(group)} {text}"
             for text, group in zip(prompts, groups, strict=True)]
    batch = processor(text=texts, images=groups, return_tensors="pt", padding=True)
    vision = bounds.get("vision") or {}
    media = {name: batch[name] for name in vision.get("inputs", ("pixel_values",)) if name in batch}
    return processor.tokenizer, batch["input_ids"], batch["attention_mask"], media


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
                   pad_token_id: int | None, trust_remote_code: bool = False,
                   shown: Path | None = None) -> tuple[Any, Any, Any, dict[str, Any]]:
    """``(tokenizer, input_ids, attention_mask, {"input_features": [chunks, mels, frames]})`` of ``prompts`` with one
    audio each: each audio cut into chunks of the export's length, the model's feature extractor (the artifact's
    ``preprocessor_config.json``) making each chunk's log-mel features, and ``chunks x tokens_per_chunk`` audio
    tokens put in front of the prompt's text (after its BOS), left-padded. ``directory`` is what transformers reads
    (the artifact's checked copy); errors name ``shown`` (the artifact)."""
    shown = shown or directory
    if not (directory / "preprocessor_config.json").is_file():
        raise UsageError(f"--audio needs the model's feature extractor, and {shown} holds no "
                         "preprocessor_config.json: export from a model directory that holds it, or pass --tokenizer "
                         "DIR (that directory)")
    from transformers import AutoFeatureExtractor

    check_configs_run_no_code(directory, trust_remote_code, shown)
    extractor = _tokenizer_call(lambda: AutoFeatureExtractor.from_pretrained(directory,
                                                                             trust_remote_code=trust_remote_code),
                                shown, "load")
    tokenizer = load_tokenizer(directory, trust_remote_code, shown)
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
