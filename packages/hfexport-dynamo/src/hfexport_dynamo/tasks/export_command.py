"""``hfexport export MODEL --task ...``: load a Transformers model that generates, export the programs of its task,
save them with the model directory's tokenizer and processor files, load the artifact back and check its greedy
generation token for token against eager ``model.generate(do_sample=False)`` (a quantized export: the share of
new tokens that agree).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

from hfexport.commands import (
    EXIT_MISMATCH,
    EXIT_OK,
    Progress,
    UsageError,
    configured_exporter,
    load_model,
    record_source_dtype,
    record_verification,
    say_export_cost,
    timed,
    write_report,
)

from .generate_command import _stats_text
from .tokenizer_files import _PROCESSOR_FILES, _TOKENIZER_FILES, _has_tokenizer


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
    # a backend that writes the tokenizer for its runtime (OpenVINO GenAI's tokenizer IR) takes the model's
    backend_options = {"tokenizer": str(args.model)} if _has_tokenizer(Path(args.model)) \
        and "tokenizer" in exporter_class.config_class.option_names() else {}
    exporter = configured_exporter(exporter_class, args, **backend_options)
    say_export_cost(exporter, model, output, args)  # its cost, refused here when this machine cannot hold it
    progress = Progress(console)
    try:
        exported = exporter.export(model, None, progress=progress, task=args.task, task_options=task_options,
                                   verify=not args.no_verify, atol=args.atol, rtol=args.rtol,
                                   check_resources=not args.no_resource_check)  # each program verified
    except (ValueError, InvalidInputError) as exc:  # an unknown task, bounds the model refuses, no head
        raise UsageError(str(exc)) from exc  # (a failed stage is an ExportError: exit 1)
    finally:
        progress.stop()
    source = Path(args.model)
    for name in (*_TOKENIZER_FILES, *_PROCESSOR_FILES):
        if (source / name).is_file() and name not in exported.extra_files:
            exported.extra_files[name] = lambda d, f=source / name: _copy_into(f, d)
    record_source_dtype(exported, args)
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
        anyres = (vision or {}).get("anyres")
        if anyres and image_tokens:  # LLaVA-NeXT/OneVision: one tile-sized image per row, its crops and tokens
            from .image_prompt import anyres_layout

            layout = anyres_layout(anyres, [anyres["tile"]] * 2)
            image_tokens = layout["tokens"] if batch * layout["crops"] <= anyres["max_crops"] else 0
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
                (batch, layout["crops"], *vision["pixel_values_shape"]) if anyres else \
                (batch, *vision["pixel_values_shape"])
            media[vision.get("media_input", "pixel_values")] = torch.randn(shape, generator=generator)
        if batch > 1:
            ids[0, :2], mask[0, :2] = pad, 0
        if image_tokens and anyres:
            media["image_sizes"] = torch.tensor([[anyres["tile"]] * 2] * batch)
            if anyres["one_crop_when_several"]:
                media["batch_num_images"] = torch.ones(batch, dtype=torch.long)
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
