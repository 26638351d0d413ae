"""The merge of images (``"image-text-to-text"``) or audio (``"audio-text-to-text"``) into the prompt on a loaded
artifact (what the model's ``forward`` does before its language model), and the task's part of the one greedy loop
(:func:`prepare_media`: the ``decoder`` program then runs on the merged embeddings); the programs are planned by
:mod:`hfexport_dynamo.tasks.image_text`."""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from .causal_lm import decoder_run
from .decoding import GreedyRun, check_prompt
from .names import AUDIO, EMBED, VISION

__all__ = ["anyres_layout", "audio_prompt", "image_prompt", "prepare_media", "rope_positions", "static_count"]


def prepare_media(exported: Any, section: Mapping[str, Any], config: Any, input_ids: Any, attention_mask: Any,
                  media: Mapping[str, Any]) -> GreedyRun:
    """The image- and audio-text tasks' part of :func:`hfexport_dynamo.tasks.decoding.generate`: the prompt checked,
    the media checked and encoded and merged into its embeddings (:func:`image_prompt`, :func:`audio_prompt`; the
    seconds in ``encode_s``), before any decoder call; then the ``decoder`` program on them
    (:func:`hfexport_dynamo.tasks.causal_lm.decoder_run`), each new token embedded by the ``embed`` program."""
    input_ids, attention_mask = check_prompt(input_ids, attention_mask, config, section)
    start = time.perf_counter()
    prompt_embeds, embed_tokens, per_position = (audio_prompt if "audio" in section else image_prompt)(
        exported, section, input_ids, attention_mask, media)
    encode_s = time.perf_counter() - start
    return decoder_run(exported, section, config, input_ids, attention_mask, prompt_embeds, embed_tokens,
                       per_position, stats={"encode_s": encode_s})


def image_prompt(exported: Any, section: Mapping[str, Any], input_ids: torch.Tensor, attention_mask: torch.Tensor,
                 media: Mapping[str, Any]
                 ) -> tuple[torch.Tensor, Callable[[torch.Tensor], torch.Tensor], dict[str, torch.Tensor]]:
    """The prompt's ``inputs_embeds`` with the images' embeddings at the image token's positions, as the model's
    ``forward`` merges them, and the decode steps' embedding of new ids.

    Args:
        exported: an artifact of task ``"image-text-to-text"``.
        section: its manifest's ``generation`` section.
        input_ids: ``int64 [batch, prompt]``, checked (:func:`hfexport_dynamo.tasks.decoding.check_prompt`); each image
            is ``tokens_per_image`` positions of ``image_token_id``, in the order of the images.
        attention_mask: ``int64 [batch, prompt]``, 0 at left padding.
        media: ``{"pixel_values": float [images, channels, height, width]}``; where the manifest says ``per_row``
            (Idefics3, SmolVLM), ``[batch, images, channels, height, width]`` with all-zero padding images, dropped
            as the model drops them, and optionally ``pixel_attention_mask`` ``[batch, images, height, width]``
            (only full images are taken); Gemma 3 optionally ``token_type_ids`` ``[batch, prompt]`` (checked: 1 at
            the image tokens). Where the manifest says ``patches`` (Qwen2-VL), the processor's packed patches
            ``float [images * patches, patch_dim]``, ``image_grid_thw`` ``int64 [images, 3]`` (each the export's
            ``grid_thw``) and optionally ``mm_token_type_ids`` ``[batch, prompt]`` (checked: 1 at the image tokens).
            Where it says ``anyres`` (LLaVA-NeXT, LLaVA-OneVision), the processor's crops ``[images, crops, C, tile,
            tile]`` (zero-padded) with ``image_sizes`` ``[images, 2]`` and (OneVision) optionally ``batch_num_images``
            ``[batch]`` (:func:`_anyres_prompt`). Nothing: a prompt without images.

    Returns:
        ``(inputs_embeds float [batch, prompt, hidden], embed, per_position)`` where ``embed(ids [batch, 1])`` runs
        the ``embed`` program, and ``per_position`` holds the decoder's other prompt inputs: ``image_blocks``
        ``int64 [batch, prompt]`` (each image's index in its row at its tokens, -1 elsewhere: transformers'
        ``get_block_sequence_ids_for_mask``) where the manifest says ``token_types`` (Gemma 3: image tokens attend
        to their whole image); ``position_ids`` ``int64 [3, batch, prompt]`` where it says ``mrope`` (Qwen2-VL:
        :func:`rope_positions`).

    Raises:
        TypeError: ``pixel_values`` is not a float tensor of rank 4 (5 where ``per_row``, 2 where ``patches``).
        ValueError: another image size than the export's, more images than ``max_images``, an image with masked
            pixels, a number of image tokens that is not ``images x tokens_per_image``, an ``image_grid_thw`` that
            is not the export's grid or missing, an image's tokens not in one run (``mrope``), or (``token_types``)
            a prompt longer than ``prefill_chunk``, or another number of images than the static one where the
            manifest says the ``vision`` program's count is static (each says which), before any program runs.
    """
    vision = section["vision"]
    token, per_image = vision["image_token_id"], vision["tokens_per_image"]
    pixel_values = media.get("pixel_values")
    image_tokens = int((input_ids == token).sum())
    images = 0
    if vision.get("anyres"):  # LLaVA-NeXT/OneVision: each image its crops, laid out after the vision program
        return _anyres_prompt(exported, vision, input_ids, media)
    if pixel_values is not None and vision.get("patches"):
        pixel_values = _patches(vision, pixel_values, media.get("image_grid_thw"))
        images = pixel_values.shape[0]
    elif pixel_values is not None:
        shape, per_row = vision["pixel_values_shape"], vision.get("per_row", False)
        layout = f"[{'batch, images' if per_row else 'images'}, {', '.join(map(str, shape))}]"
        if not isinstance(pixel_values, torch.Tensor) or not pixel_values.is_floating_point() \
                or pixel_values.dim() != 4 + per_row:
            raise TypeError(f"pixel_values must be a float tensor {layout}, got "
                            f"{getattr(pixel_values, 'dtype', type(pixel_values).__name__)} of shape "
                            f"{list(getattr(pixel_values, 'shape', []))}")
        if list(pixel_values.shape[1 + per_row:]) != shape:
            height, width = vision["image_size"]
            raise ValueError(f"pixel_values has images of {list(pixel_values.shape[1 + per_row:])}; this export "
                             f"takes {layout} (its image size, {height}x{width}, the config's "
                             f"vision_config.image_size): resize the images to {height}x{width} (the model's image "
                             "processor does), or export again at that size")
        if per_row:  # the model's get_image_features: padding images are all zeros
            pixel_values = pixel_values.flatten(0, 1)
            real = (pixel_values != 0).flatten(1).any(-1)
            mask = media.get("pixel_attention_mask")
            if mask is not None and not bool(torch.as_tensor(mask).flatten(0, 1)[real].bool().all()):
                raise ValueError("pixel_attention_mask hides pixels of an image: this export encodes whole images "
                                 f"of {shape[1]}x{shape[2]} (the model's processor makes them so when it resizes "
                                 "and splits images)")
            pixel_values = pixel_values[real]
        images = pixel_values.shape[0]
    if images > vision["max_images"]:
        raise ValueError(f"{images} images exceed this export's max_images={vision['max_images']}: pass fewer, "
                         "or export again with a larger max_images")
    _check_count(exported, VISION, "pixel_values", images, "images")
    if image_tokens != images * per_image:
        raise ValueError(f"input_ids hold {image_tokens} image tokens (id {token}) for {images} image(s) of "
                         f"{per_image} tokens each: put {per_image} image tokens per image in the prompt, as the "
                         "model's processor does")

    per_position = {}
    is_image = input_ids == token
    types_name = "token_type_ids" if vision.get("token_types") else "mm_token_type_ids"
    types = media.get(types_name)  # the processor's: 1 at image tokens (read from the ids here)
    if types is not None and not torch.equal(torch.as_tensor(types).long(), is_image.long()):
        raise ValueError(f"{types_name} must be 1 exactly at the image tokens (id {token}), as the model's "
                         "processor makes them; or leave them out")
    if vision.get("mrope"):
        per_position["position_ids"] = rope_positions(input_ids, attention_mask, token, vision["grid_thw"],
                                                      vision["spatial_merge_size"])
    if vision.get("token_types"):  # the decoder's bidirectional image blocks are read within one prefill call
        if input_ids.shape[1] > section["prefill_chunk"]:
            raise ValueError(f"a prompt of {input_ids.shape[1]} tokens exceeds this export's prefill_chunk="
                             f"{section['prefill_chunk']}: its image tokens attend to their whole image, which one "
                             "prefill call must hold; shorten the prompt or export with a larger prefill_chunk")
        starts = is_image & ~torch.nn.functional.pad(is_image, (1, 0))[:, :-1]
        per_position["image_blocks"] = torch.where(is_image, starts.long().cumsum(-1) - 1, -1)

    embeds, embed = _merged(exported, input_ids, is_image, VISION, {"pixel_values": pixel_values} if images else {})
    return embeds, embed, per_position


def anyres_layout(anyres: Mapping[str, Any], image_size: Sequence[int], one_crop: bool = False
                  ) -> dict[str, Any]:
    """How LLaVA-NeXT/OneVision lay out one image of ``image_size`` ``(height, width)`` (the processor's
    ``image_sizes`` row) before its language model, from the manifest's ``vision.anyres``, by transformers' own
    functions (``select_best_resolution``, ``unpad_image``) on shapes alone.

    Returns:
        ``{"crops": the base crop and the best grid's tiles (1 where ``one_crop``: OneVision's images in a prompt of
        several), "grid": (rows, cols) of tiles, "unpadded": (height, width) in tokens after unpadding, "scaled":
        (height, width) after OneVision's downscaling or None, "tokens": the image's tokens in the prompt}``.
    """
    from transformers.image_processing_utils import select_best_resolution
    from transformers.models.llava_next.modeling_llava_next import unpad_image

    side = anyres["tokens_per_side"]
    if one_crop:
        return {"crops": 1, "grid": None, "unpadded": None, "scaled": None, "tokens": side * side + 1}
    height, width = select_best_resolution([int(v) for v in image_size], anyres["grid_pinpoints"])
    rows, cols = height // anyres["tile"], width // anyres["tile"]
    current = unpad_image(torch.empty(0, rows * side, cols * side, device="meta"), [int(v) for v in image_size])
    unpadded = scaled = tuple(current.shape[1:])
    limit = anyres.get("max_tiles_ratio")
    if limit is not None:
        ratio = math.sqrt(unpadded[0] * unpadded[1] / (limit * side**2))
        scaled = (int(unpadded[0] // ratio), int(unpadded[1] // ratio)) if ratio > 1.1 else None
    lines = scaled or unpadded
    return {"crops": 1 + rows * cols, "grid": (rows, cols), "unpadded": unpadded,
            "scaled": scaled if scaled != unpadded else None, "tokens": side * side + lines[0] * (lines[1] + 1)}


def _anyres_prompt(exported: Any, vision: Mapping[str, Any], input_ids: torch.Tensor, media: Mapping[str, Any]
                   ) -> tuple[torch.Tensor, Callable[[torch.Tensor], torch.Tensor], dict[str, torch.Tensor]]:
    """:func:`image_prompt` for LLaVA-NeXT/OneVision: each image's crops (the processor's ``pixel_values`` ``[images,
    crops, C, tile, tile]``, zero-padded to the most crops; or its crops concatenated, ``[crops, C, tile, tile]``),
    the crops :func:`anyres_layout` gives for its ``image_sizes`` row taken as the model takes them, encoded in one
    call of the ``vision`` program, and laid out as the model's ``pack_image_features``: the base crop's tokens,
    then the tiles' token grid unpadded to the image's aspect, (OneVision) downscaled to ``anyres_max_<n>`` tiles'
    worth, each of its rows ended by the model's ``image_newline``; OneVision's images in a prompt of several
    (``batch_num_images``) their base crop and one newline."""
    anyres, shape = vision["anyres"], vision["pixel_values_shape"]
    token = vision["image_token_id"]
    pixel_values, sizes = media.get("pixel_values"), media.get("image_sizes")
    counts = media.get("batch_num_images")
    is_image = input_ids == token
    image_tokens = int(is_image.sum())
    layouts: list[dict[str, Any]] = []
    if pixel_values is not None:
        layout = f"[images, crops, {', '.join(map(str, shape))}] or [crops, {', '.join(map(str, shape))}]"
        if not isinstance(pixel_values, torch.Tensor) or not pixel_values.is_floating_point() \
                or pixel_values.dim() not in (4, 5) or list(pixel_values.shape[-3:]) != shape:
            raise TypeError(f"pixel_values must be a float tensor {layout} (the processor's crops of "
                            f"{shape[1]}x{shape[2]}), got {getattr(pixel_values, 'dtype', type(pixel_values).__name__)}"
                            f" of shape {list(getattr(pixel_values, 'shape', []))}")
        if sizes is None:
            raise ValueError("pixel_values of LLaVA-NeXT/OneVision need their image_sizes [images, 2] (the "
                             "processor's: each image's height and width before tiling)")
        sizes = torch.as_tensor(sizes).reshape(-1, 2).tolist()
        images = len(sizes)
        if images > vision["max_images"]:
            raise ValueError(f"{images} images exceed this export's max_images={vision['max_images']}: pass fewer, "
                             "or export again with a larger max_images")
        one_crop = [False] * images
        if counts is not None and anyres.get("one_crop_when_several"):  # OneVision: as get_image_features
            counts = [int(n) for n in torch.as_tensor(counts).reshape(-1).tolist()]
            if sum(counts) != images:
                raise ValueError(f"batch_num_images {counts} add up to {sum(counts)}, not the {images} images of "
                                 "image_sizes")
            one_crop = [n != 1 for n in counts for _ in range(n)]
        layouts = [anyres_layout(anyres, size, one) for size, one in zip(sizes, one_crop, strict=True)]
        if pixel_values.dim() == 5:  # the processor's zero-padded crops per image: the model takes the first ones
            if pixel_values.shape[0] != images or any(item["crops"] > pixel_values.shape[1] for item in layouts):
                raise ValueError(f"pixel_values {list(pixel_values.shape)} do not hold the crops of the {images} "
                                 f"image(s) of image_sizes ({[item['crops'] for item in layouts]} crops): pass the "
                                 "processor's pixel_values and image_sizes together")
            pixel_values = torch.cat([crops[:item["crops"]] for crops, item in zip(pixel_values, layouts, strict=True)])
        elif pixel_values.shape[0] != sum(item["crops"] for item in layouts):
            raise ValueError(f"pixel_values holds {pixel_values.shape[0]} crops for image_sizes that give "
                             f"{sum(item['crops'] for item in layouts)}: pass the processor's pixel_values and "
                             "image_sizes")
        if pixel_values.shape[0] > anyres["max_crops"]:
            raise ValueError(f"{pixel_values.shape[0]} crops exceed this export's max_crops={anyres['max_crops']} "
                             f"(max_images={vision['max_images']} of the most tiles a grid pinpoint gives): pass fewer "
                             "or smaller images, or export again with a larger max_images")
    if image_tokens != sum(item["tokens"] for item in layouts):
        raise ValueError(f"input_ids hold {image_tokens} image tokens (id {token}) for image(s) of "
                         f"{[item['tokens'] for item in layouts]} tokens (image_sizes): put each image's tokens in the "
                         "prompt as the model's processor does")
    if not layouts:
        embeds, embed = _merged(exported, input_ids, is_image, VISION, {})
        return embeds, embed, {}

    def pack(features: torch.Tensor) -> torch.Tensor:  # the vision program's crops, each image laid out
        newline, features = features[-1], features[:-1].reshape(-1, vision["tokens_per_image"], features.shape[-1])
        side, out = anyres["tokens_per_side"], []
        for crops, layout in zip(features.split([item["crops"] for item in layouts]), layouts, strict=True):
            if layout["grid"] is None:
                out += [crops[0], newline[None]]
                continue
            rows, cols = layout["grid"]
            grid = crops[1:].view(rows, cols, side, side, -1).permute(4, 0, 2, 1, 3).flatten(1, 2).flatten(2, 3)
            (height, width), (full_h, full_w) = layout["unpadded"], grid.shape[1:]
            top, left = (full_h - height) // 2, (full_w - width) // 2
            grid = grid[:, top:top + height, left:left + width]
            if layout["scaled"] is not None:
                grid = torch.nn.functional.interpolate(grid[None], list(layout["scaled"]), mode="bilinear")[0]
            grid = torch.cat([grid, newline[:, None, None].expand(*grid.shape[:-1], 1)], dim=-1)
            out += [crops[0], grid.flatten(1, 2).transpose(0, 1)]
        return torch.cat(out)

    embeds, embed = _merged(exported, input_ids, is_image, VISION, {"pixel_values": pixel_values}, pack)
    return embeds, embed, {}


def audio_prompt(exported: Any, section: Mapping[str, Any], input_ids: torch.Tensor, attention_mask: torch.Tensor,
                 media: Mapping[str, Any]
                 ) -> tuple[torch.Tensor, Callable[[torch.Tensor], torch.Tensor], dict[str, torch.Tensor]]:
    """:func:`image_prompt` for an ``"audio-text-to-text"`` artifact (Voxtral): the ``audio`` program's embeddings
    of each chunk scattered, in order, over the positions of ``audio_token_id``.

    Args:
        media: ``{"input_features": float [chunks, mels, frames]}`` (the processor's log-mel chunks of the
            export's fixed length, every row's in order), or nothing (a prompt without audio).

    Returns:
        ``(inputs_embeds, embed, {})`` as :func:`image_prompt`'s.

    Raises:
        TypeError: ``input_features`` is not a float tensor of rank 3.
        ValueError: chunks of another shape than the export's, more chunks than ``max_audio_chunks``, or a number
            of audio tokens that is not ``chunks x tokens_per_chunk`` (each says which), before any program runs.
    """
    audio = section["audio"]
    token, per_chunk, shape = audio["audio_token_id"], audio["tokens_per_chunk"], audio["input_features_shape"]
    features = media.get("input_features")
    chunks = 0
    if features is not None:
        if not isinstance(features, torch.Tensor) or not features.is_floating_point() or features.dim() != 3:
            raise TypeError(f"input_features must be a float tensor [chunks, {shape[0]}, {shape[1]}], got "
                            f"{getattr(features, 'dtype', type(features).__name__)} of shape "
                            f"{list(getattr(features, 'shape', []))}")
        if list(features.shape[1:]) != shape:
            raise ValueError(f"input_features has chunks of {list(features.shape[1:])}; this export takes "
                             f"[chunks, {shape[0]}, {shape[1]}] ({shape[0]} mel bins, {shape[1]} frames: the audio "
                             "encoder's fixed length, to which the model's feature extractor pads each chunk)")
        chunks = features.shape[0]
    if chunks > audio["max_audio_chunks"]:
        raise ValueError(f"{chunks} audio chunks exceed this export's max_audio_chunks={audio['max_audio_chunks']}: "
                         "pass fewer, or export again with a larger max_batch")
    _check_count(exported, AUDIO, "input_features", chunks, "audio chunks")
    is_audio = input_ids == token
    if int(is_audio.sum()) != chunks * per_chunk:
        raise ValueError(f"input_ids hold {int(is_audio.sum())} audio tokens (id {token}) for {chunks} chunk(s) of "
                         f"{per_chunk} tokens each: put {per_chunk} audio tokens per chunk in the prompt, as the "
                         "model's processor does")
    embeds, embed = _merged(exported, input_ids, is_audio, AUDIO, {"input_features": features} if chunks else {})
    return embeds, embed, {}


def static_count(exported: Any, program: str, name: str) -> int | None:
    """The number of items (images, audio chunks) the ``program`` component takes per call where its manifest says
    that count is static (``name``'s dim 0 not among its ``dynamic_dims``: ``max_images=1``, or a count the
    model's code fixed at trace time), else None (a dynamic count, or a manifest without the component)."""
    section = exported.manifest.get("components", {}).get(program) or {}
    entry = next((i for i in section.get("inputs", ()) if i.get("name") == name), None)
    if entry is None or "0" in (entry.get("dynamic_dims") or {}) or not entry.get("shape"):
        return None
    count = entry["shape"][0]
    return count if isinstance(count, int) else None


def _check_count(exported: Any, program: str, name: str, count: int, what: str) -> None:
    """Refuse, before any program runs, ``count`` items where the manifest says the program takes a static other
    number (:func:`static_count`); 0 (a prompt without them) runs no such program."""
    static = static_count(exported, program, name)
    if count and static is not None and count != static:
        raise ValueError(f"{count} {what}: this export's {program} program takes exactly {static} per call (its "
                         f"manifest's {name} dim 0 is static, not a range), so another count would fail inside it; "
                         f"pass {static}, or export again with a range of {what} (max_images, or max_batch for "
                         "audio chunks)")


def _merged(exported: Any, input_ids: torch.Tensor, at: torch.Tensor, program: str, encoded: Mapping[str, Any],
            layout: Callable[[torch.Tensor], torch.Tensor] | None = None
            ) -> tuple[torch.Tensor, Callable[[torch.Tensor], torch.Tensor]]:
    """The prompt's ``inputs_embeds`` (the ``embed`` program) with ``program``'s one output on ``encoded`` (cast to
    the embeddings' dtype; then through ``layout``, if given) scattered over the positions ``at`` (``bool [batch,
    prompt]``), as the models' ``masked_scatter``; and the decode steps' embedding of new ids."""
    def embed(ids: torch.Tensor) -> torch.Tensor:
        return exported.run(EMBED, input_ids=ids)["inputs_embeds"]

    embeds = embed(input_ids)
    if encoded:
        (features,) = exported.run(program, **{k: v.to(embeds.dtype) for k, v in encoded.items()}).values()
        features = features.to(embeds.dtype)
        embeds = embeds.masked_scatter(at[..., None], layout(features) if layout else features)
    return embeds, embed


def _patches(vision: Mapping[str, Any], pixel_values: Any, grid_thw: Any) -> torch.Tensor:
    """Qwen2-VL's packed patches ``[images * patches, patch_dim]`` checked against the export's grid, as the vision
    program's ``[images, patches, patch_dim]``."""
    shape, grid = vision["pixel_values_shape"], vision["grid_thw"]
    height, width = vision["image_size"]
    if not isinstance(pixel_values, torch.Tensor) or not pixel_values.is_floating_point() or pixel_values.dim() != 2 \
            or pixel_values.shape[1] != shape[1]:
        raise TypeError(f"pixel_values must be a float tensor [images * {shape[0]}, {shape[1]}] (the processor's "
                        f"packed patches), got {getattr(pixel_values, 'dtype', type(pixel_values).__name__)} of "
                        f"shape {list(getattr(pixel_values, 'shape', []))}")
    if grid_thw is None:
        raise ValueError("pixel_values of packed patches need their image_grid_thw [images, 3] (the processor's)")
    grids = torch.as_tensor(grid_thw).reshape(-1, 3)
    if not bool((grids == torch.tensor(grid)).all()):
        raise ValueError(f"image_grid_thw holds {sorted({tuple(g) for g in grids.tolist()})}; this export takes "
                         f"images of the grid {grid} ({height}x{width} pixels): resize the images to {height}x{width} "
                         "before the model's processor, or export again with an example of that size")
    if pixel_values.shape[0] != grids.shape[0] * shape[0]:
        raise ValueError(f"pixel_values holds {pixel_values.shape[0]} patches for {grids.shape[0]} image(s) of "
                         f"{shape[0]} patches (image_grid_thw): pass the processor's pixel_values and grid together")
    return pixel_values.reshape(-1, *shape)


def rope_positions(input_ids: torch.Tensor, attention_mask: torch.Tensor, image_token_id: int,
                   grid_thw: Sequence[int], spatial_merge_size: int) -> torch.Tensor:
    """Qwen2-VL's multimodal RoPE positions of a prompt, as the model's ``get_rope_index`` computes them: over each
    row's tokens (padding left at 0), a run of text counts on from the position reached; an image's run of tokens
    takes ``(t, h, w)`` positions over its merged grid, each offset by the position reached, which then advances
    by ``max(h, w)``.

    Args:
        input_ids, attention_mask: ``int64 [batch, prompt]``.
        image_token_id: the image token; each image is one run of ``t * h * w / spatial_merge_size ** 2`` of them.
        grid_thw: every image's ``(t, h, w)`` in patches.
        spatial_merge_size: the patches merged per side into one image token.

    Returns:
        ``int64 [3, batch, prompt]``.

    Raises:
        ValueError: a run of image tokens that is not one image's (the processor puts ``<|vision_start|>`` and
            ``<|vision_end|>`` around each image).
    """
    t, h, w = grid_thw[0], grid_thw[1] // spatial_merge_size, grid_thw[2] // spatial_merge_size
    grid = torch.stack(torch.meshgrid(torch.arange(t), torch.arange(h), torch.arange(w), indexing="ij")).reshape(3, -1)
    positions = torch.zeros(3, *input_ids.shape, dtype=torch.long)
    for row in range(input_ids.shape[0]):
        keep = attention_mask[row].bool()
        is_image = (input_ids[row][keep] == image_token_id).tolist()
        parts, reached = [], 0
        for image, run in itertools.groupby(is_image):
            length = len(list(run))
            if image and length != grid.shape[1]:
                raise ValueError(f"a run of {length} image tokens (id {image_token_id}) in row {row}: each image is "
                                 f"one run of {grid.shape[1]} (put other tokens between images, as the processor's "
                                 "<|vision_start|> and <|vision_end|> do)")
            parts.append(grid + reached if image else torch.arange(length).expand(3, -1) + reached)
            reached += max(h, w) if image else length
        if parts:
            positions[:, row, keep] = torch.cat(parts, 1)
    return positions
