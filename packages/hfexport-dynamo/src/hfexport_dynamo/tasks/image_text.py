"""Image-text-to-text generation (``task="image-text-to-text"``): a vision-language model exported as the three
programs its greedy generation runs, and the merge of image embeddings into the prompt between them.

Components (one model; each program holds only the weights it reads):

* ``vision``: ``pixel_values`` ``float [images, channels, height, width]`` -> ``image_embeds`` ``float
  [images * tokens_per_image, hidden]``: the vision tower and the projector, the model's own
  ``get_image_features``. The image size is static, the config's (``vision_config.image_size``: the size the
  model's image processor resizes to); the number of images is a dynamic dim in ``[1, max_images]``.
* ``embed``: ``input_ids`` ``int64 [batch, seq]`` -> ``inputs_embeds`` ``float [batch, seq, hidden]``: the text
  model's token embedding.
* ``decoder``: the text-generation decoder (:class:`hfexport_dynamo.tasks.causal_lm.CausalLMStep`: one program for the
  prefill and every decode step, a KV cache of ``max_cache_len`` positions that the runtime updates in place, the
  same bounds, dims and manifest ``cache`` section), over the language model and its head, taking
  ``inputs_embeds`` ``float [batch, seq, hidden]`` instead of ``input_ids``.

:func:`hfexport_dynamo.tasks.image_prompt.image_prompt` does what the model's ``forward`` does before its language
model: it embeds the prompt's ids, encodes the images and scatters their embeddings, in order, over the positions
that hold ``image_token_id`` (``inputs_embeds.masked_scatter``). The decode steps embed each new token with the
``embed`` program. Greedy decoding is then the text decoder's (:class:`hfexport_dynamo.tasks.causal_lm.
DecoderPrograms` under the one greedy loop), token for token eager ``model.generate(input_ids,
attention_mask=..., pixel_values=..., do_sample=False)``.

Families (:data:`FAMILIES`): those whose language model takes ``inputs_embeds`` with 1-D position ids and whose
images are merged at the image token's positions: LLaVA (``get_image_features`` on ``[images, C, H, W]``),
Idefics3/SmolVLM (the vision model and pixel-shuffle connector; the processor's ``[batch, images, C, H, W]`` with
all-zero padding images, which ``generate`` drops as the model does, so that a prompt may hold several images) and
Gemma 3 (an image's tokens attend to the whole image inside the causal mask: the decoder also takes
``image_blocks``, and attends without a runtime's causal-only fused kernel; a prompt must fit one prefill call).
Qwen2-VL and Qwen2.5-VL take the processor's packed patches at one static grid and 3-D RoPE positions (the vision
program computes the patch positions, per-image segments and, for Qwen2.5-VL, the windows for that grid;
``generate`` computes the decoder's ``position_ids [3, batch, seq]``). LLaVA-NeXT and LLaVA-OneVision tile each
image (anyres): the ``vision`` program encodes the processor's crops of every image as one batch ``[crops, C, tile,
tile]`` (a dynamic count up to ``max_crops``: ``max_images`` of the most tiles a grid pinpoint gives, plus each base
crop) and ``generate`` lays each image out for its ``image_sizes`` as the model's ``pack_image_features`` does. Voxtral (``task="audio-text-to-text"``) has
an ``audio`` program in place of ``vision`` (:class:`AudioStep`), merged at its audio token the same way.
The manifest's ``generation.vision`` records the image size, the image token, the tokens per image, the layout and
the bound on images; ``generate`` refuses another image size by name before any program runs, and
``run("vision", ...)`` refuses it as any static dim.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from hfexport.plugin import InvalidInputError

from .causal_lm import CausalLMStep, plan_decoder
from .names import AUDIO, AUDIO_TEXT_TO_TEXT, EMBED, IMAGE_TEXT_TO_TEXT, VISION
from .planning import check_prefill_chunk, checked_bounds, example_prompt, generation_manifest

__all__ = ["FAMILIES", "EmbedsLMStep", "Family", "LanguageModelHead", "TokenEmbedStep", "ImageBlocksLMStep", "VisionStep",
           "plan_image_text"]


@dataclass(frozen=True)
class Family:
    """Where a vision-language model keeps its parts, and how its images reach the vision tower.

    Attributes:
        inner: the attribute of the ``...ForConditionalGeneration`` that holds the parts (``"model"``).
        vision: the inner model's vision modules (tower, projector or connector): the ``vision`` program's weights.
        language: the inner model's language model (a transformers ``...Model`` taking ``inputs_embeds``).
        encode: ``"get_image_features"`` (the model's own, on ``[images, C, H, W]``), ``"tower_connector"``
            (``connector(vision_model(pixel_values).last_hidden_state)``: Idefics3/SmolVLM's
            ``get_image_features`` without its data-dependent removal of padding images, which ``generate`` does),
            ``"crops"`` (LLaVA-NeXT/OneVision: the vision tower's selected hidden states and the projector on
            ``[crops, C, tile, tile]``, ``image_newline`` appended as the last row; see ``anyres``),
            or ``"patches"`` (Qwen2-VL: the vision model on each image's flattened patches ``[images, patches,
            channels * temporal_patch * patch * patch]`` at one static grid, its patch positions and per-image
            segments computed for that grid instead of from ``image_grid_thw``).
        per_row: the processor gives ``pixel_values [batch, images, C, H, W]`` with all-zero padding images
            (Idefics3/SmolVLM), not ``[images, C, H, W]``.
        token_types: an image's tokens attend to each other both ways inside the causal mask (Gemma 3): the
            decoder takes ``image_blocks`` ``int64 [batch, seq]`` (the image's index at its tokens, -1 elsewhere and
            at decode steps: transformers' ``block_sequence_ids``, which ``generate`` computes from the image
            tokens) and builds its masks with the model module's ``create_masks_for_vision_model``.
        media: ``"image"``, or ``"audio"`` (task ``"audio-text-to-text"``: the ``audio`` program, an
            :class:`AudioStep`, takes the feature extractor's log-mel chunks in place of images).
        anyres: LLaVA-NeXT / LLaVA-OneVision's tiling (``encode="crops"``): the processor gives each image as its
            base crop and the tiles of the best grid from ``image_grid_pinpoints`` for its ``image_sizes``; the
            ``vision`` program encodes the crops of every image as one batch ``[crops, C, tile, tile]`` (vision
            tower, feature layer and selection, projector) and ``generate`` lays them out per image as the model's
            ``pack_image_features`` does (unpadding, newlines, OneVision's downscaling):
            :func:`hfexport_dynamo.tasks.image_prompt.anyres_layout`.
        mrope: the language model's RoPE takes 3-D positions (Qwen2-VL's multimodal RoPE): the decoder's
            ``position_ids`` are ``int64 [3, batch, seq]`` (temporal, height, width), which ``generate`` computes
            as the model's ``get_rope_index`` does.
    """

    inner: str
    vision: tuple[str, ...]
    language: str
    encode: str = "get_image_features"
    per_row: bool = False
    token_types: bool = False
    mrope: bool = False
    media: str = "image"
    anyres: bool = False


_SPLITTING = Family("model", ("vision_model", "connector"), "text_model", "tower_connector", per_row=True)
_ANYRES = Family("model", ("vision_tower", "multi_modal_projector", "image_newline"), "language_model", "crops",
                 anyres=True)
FAMILIES: dict[str, Family] = {
    "LlavaForConditionalGeneration": Family("model", ("vision_tower", "multi_modal_projector"), "language_model"),
    "Idefics3ForConditionalGeneration": _SPLITTING,
    "SmolVLMForConditionalGeneration": _SPLITTING,
    "Gemma3ForConditionalGeneration": Family("model", ("vision_tower", "multi_modal_projector"), "language_model",
                                             token_types=True),
    "LlavaNextForConditionalGeneration": _ANYRES,
    "LlavaOnevisionForConditionalGeneration": _ANYRES,
    "Qwen2VLForConditionalGeneration": Family("model", ("visual",), "language_model", "patches", mrope=True),
    "Qwen2_5_VLForConditionalGeneration": Family("model", ("visual",), "language_model", "patches", mrope=True),
    "VoxtralForConditionalGeneration": Family("model", ("audio_tower", "multi_modal_projector"), "language_model",
                                              "get_audio_features", media="audio"),
}
_TRACE_IMAGES = 2  # not 1: torch.export specializes a dim of size 1


class _Holding(torch.nn.Module):
    """A program's module that registers only the submodules its forward reads (torch.export lifts every
    registered parameter, used or not), and calls the model's own methods through ``self.inner`` (not
    registered: its parameters are reached through the registered submodules, the same objects)."""

    def __init__(self, inner: torch.nn.Module, names: tuple[str, ...], config: Any):
        super().__init__()
        object.__setattr__(self, "inner", inner)
        for name in names:
            setattr(self, name, getattr(inner, name))
        self.config = config


class VisionStep(_Holding):
    """The ``vision`` program: ``pixel_values [images, channels, height, width]`` -> ``{"image_embeds": float
    [images * tokens_per_image, hidden]}`` by the model's ``get_image_features`` (vision tower, feature layer and
    selection, projector), or its vision model and connector (:attr:`Family.encode`); Qwen2-VL: ``pixel_values
    [images, patches, patch_dim]`` at the static ``grid`` ``(t, h, w)`` in patches."""

    def __init__(self, inner: torch.nn.Module, family: Family, config: Any, grid: tuple[int, int, int] | None = None):
        super().__init__(inner, family.vision, config)
        self.encode = family.encode
        self.windows = grid is not None and hasattr(self.visual, "window_size")  # Qwen2.5-VL's window attention
        if grid is not None:  # one image's patch positions (transformers' own, for the static grid): constants
            from transformers.vision_utils import get_vision_position_ids, get_vision_window_index

            self.register_buffer("grid", torch.tensor([grid]), persistent=False)
            self.register_buffer("patch_positions", get_vision_position_ids(
                self.grid, self.visual.spatial_merge_size), persistent=False)
            if self.windows:  # its merged tokens' order by window, and the windows' ends in patches
                order, ends = get_vision_window_index(self.grid, self.visual.spatial_merge_size,
                                                      self.visual.window_size, self.visual.patch_size)
                self.register_buffer("window_order", order, persistent=False)
                self.register_buffer("window_ends", ends[1:], persistent=False)

    def forward(self, pixel_values: torch.Tensor) -> dict[str, torch.Tensor]:
        if self.encode == "patches":  # the images' segments: cu_seqlens of equal images, no data-dependent grid
            images, patches = pixel_values.shape[:2]
            segments = torch.arange(images + 1, dtype=torch.int32, device=pixel_values.device) * patches
            windows = {}
            if self.windows:  # each image's windows, the images one after the other
                image = torch.arange(images, device=pixel_values.device)[:, None]
                ends = (self.window_ends[None] + image * patches).flatten().to(torch.int32)
                windows = {"window_index": (self.window_order[None] + image * self.window_order.numel()).flatten(),
                           "cu_window_seqlens": torch.cat([segments[:1], ends])}
            out = self.visual(pixel_values.flatten(0, 1), grid_thw=self.grid.expand(images, -1),
                              position_ids=self.patch_positions.repeat(images, 1), cu_seqlens=segments, **windows)
            return {"image_embeds": out.pooler_output}
        if self.encode == "crops":  # LLaVA-NeXT/OneVision: every image's crops as one batch, laid out by generate
            layer = self.config.vision_feature_layer
            states = self.vision_tower(pixel_values, output_hidden_states=layer, return_dict=True).hidden_states
            selected = states[layer] if isinstance(layer, int) else torch.cat([states[i] for i in layer], dim=-1)
            if self.config.vision_feature_select_strategy == "default":
                selected = selected[:, 1:]
            features = self.multi_modal_projector(selected)  # [crops, tokens, hidden]
            # the model's image_newline as the last row: generate puts it after each row of an image's tiles
            return {"image_embeds": torch.cat([features.flatten(0, 1), self.image_newline[None].to(features.dtype)])}
        if self.encode == "tower_connector":
            hidden = self.vision_model(pixel_values=pixel_values, return_dict=True).last_hidden_state
            features = self.connector(hidden)
            return {"image_embeds": features.reshape(-1, features.shape[-1])}
        features = self.inner.get_image_features(pixel_values=pixel_values, return_dict=True).pooler_output
        if isinstance(features, torch.Tensor):
            features = [features]
        return {"image_embeds": torch.cat([f.reshape(-1, f.shape[-1]) for f in features])}


class AudioStep(_Holding):
    """The ``audio`` program (task ``"audio-text-to-text"``): ``input_features [chunks, mels, frames]`` (the feature
    extractor's log-mel chunks at the encoder's fixed length) -> ``{"audio_embeds": float [chunks *
    tokens_per_chunk, hidden]}`` by the model's ``get_audio_features`` (audio encoder, frames stacked, projector)."""

    def __init__(self, inner: torch.nn.Module, family: Family, config: Any):
        super().__init__(inner, family.vision, config)

    def forward(self, input_features: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"audio_embeds": self.inner.get_audio_features(input_features=input_features,
                                                              return_dict=True).pooler_output}


class TokenEmbedStep(torch.nn.Module):
    """The ``embed`` program: ``input_ids [batch, seq]`` -> ``{"inputs_embeds": float [batch, seq, hidden]}`` (the
    text model's input embedding, with any scale it applies)."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.embed_tokens = model.get_input_embeddings()
        self.config = model.config

    def forward(self, input_ids: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"inputs_embeds": self.embed_tokens(input_ids)}


class _Output(dict):
    """What :class:`LanguageModelHead` returns: ``logits`` and ``cache`` as attributes (the decoder step reads
    them so)."""

    __getattr__ = dict.__getitem__


class LanguageModelHead(_Holding):
    """A vision-language model's language model and head, called as a causal LM on ``inputs_embeds`` (what the
    ``decoder`` program wraps; the vision weights and the token embedding, the ``embed`` program's, stay out of
    it).

    Forward: ``inputs_embeds [batch, seq, hidden]``, ``attention_mask``, ``position_ids``, ``cache`` (a transformers
    ``Cache``), ``use_cache``, ``logits_to_keep`` -> ``logits [batch, logits_to_keep, vocab]`` and ``cache``.
    """

    def __init__(self, model: torch.nn.Module, inner: torch.nn.Module, language_model: str):
        text = getattr(inner, language_model)
        embedding = text.get_input_embeddings()
        # the language model's parts but its token embedding (the embed program's; read from inputs_embeds here)
        super().__init__(text, tuple(name for name, child in text.named_children() if child is not embedding),
                         text.config)
        self.lm_head = model.get_output_embeddings()
        self.generation_config = getattr(model, "generation_config", None)

    def forward(self, inputs_embeds: torch.Tensor, attention_mask: torch.Tensor | None = None,
                position_ids: torch.Tensor | None = None, cache: Any = None, use_cache: bool = True,
                logits_to_keep: int = 0, image_blocks: torch.Tensor | None = None) -> _Output:
        if image_blocks is not None:  # Gemma 3: each image's tokens attend to the whole image
            attention_mask = image_block_masks(image_blocks, attention_mask, cache.layers[0].cumulative_length,
                                               getattr(self.config, "sliding_window", None))
        out = self.inner(inputs_embeds=inputs_embeds, attention_mask=attention_mask, position_ids=position_ids,
                         cache=cache, use_cache=use_cache)
        hidden = out.last_hidden_state
        return _Output(logits=self.lm_head(hidden[:, -logits_to_keep:] if logits_to_keep else hidden),
                       cache=out.cache)


def image_block_masks(blocks: torch.Tensor, attention_mask: torch.Tensor, past_length: torch.Tensor,
                      sliding_window: int | None) -> dict[str, torch.Tensor]:
    """The masks of Gemma 3's language model with bidirectional image blocks, as transformers'
    ``create_masks_for_vision_model`` composes them (``full_attention``: ``(causal | same block) & padding``;
    ``sliding_attention``: that ``& (q - k < sliding_window)``), built here over the cache's whole capacity:
    transformers' own pads the block ids behind a branch on the sequence length and specializes a query of one
    position, which bounds the ``seq`` dim away from 1 and from the capacity.

    Args:
        blocks: ``int64 [batch, seq]``, each image's index at its tokens, -1 elsewhere (new positions from
            ``past_length``; blocks occur only in a prefill from position 0).
        attention_mask: ``int64 [batch, max_cache_len]``, 1 at cached and new positions holding tokens.
        past_length: ``int64 []``, the positions already cached.
        sliding_window: the sliding layers' window (None: no sliding layers).

    Returns:
        ``{"full_attention": bool [batch, 1, seq, max_cache_len], "sliding_attention": ...}`` (True: attend).
    """
    capacity = attention_mask.shape[-1]
    keys = torch.arange(capacity, device=blocks.device)
    queries = torch.arange(blocks.shape[1], device=blocks.device) + past_length
    # the blocks over the whole capacity, -1 past the new positions (a gather: no tensor of size capacity - seq,
    # whose size may be 0, which ExecuTorch's memory planning bounds away from it)
    seq = blocks.shape[1]
    padded = blocks.gather(1, keys.clamp(max=seq - 1)[None].expand(blocks.shape[0], -1))
    padded = torch.where(keys[None] < seq, padded, -1)
    query_blocks = blocks[:, :, None]  # a query's block: its own position's (blocks start at position 0)
    same_block = (query_blocks == padded[:, None, :]) & (query_blocks >= 0)
    full = ((keys[None, :] <= queries[:, None])[None] | same_block) & attention_mask[:, None, :].bool()
    sliding = full
    if sliding_window is not None:
        sliding = full & ((queries[:, None] - keys[None, :]) < sliding_window)[None]
    return {"full_attention": full[:, None], "sliding_attention": sliding[:, None]}


class EmbedsLMStep(CausalLMStep):
    """The ``decoder`` program of an image-text-to-text export: :class:`CausalLMStep` taking ``inputs_embeds``
    ``float [batch, seq, hidden]`` instead of ``input_ids`` (same arguments, cache and outputs)."""

    def forward(self, inputs_embeds: torch.Tensor, attention_mask: torch.Tensor,
                position_ids: torch.Tensor | None = None, past_length: torch.Tensor | None = None,
                cache: tuple[tuple[torch.Tensor, torch.Tensor], ...] | None = None) -> dict[str, Any]:
        return self._step({"inputs_embeds": inputs_embeds}, attention_mask, position_ids, past_length, cache)


class ImageBlocksLMStep(CausalLMStep):
    """:class:`EmbedsLMStep` that also takes ``image_blocks`` ``int64 [batch, seq]`` (each image's index at its
    tokens, which attend to the whole image; -1 elsewhere: :attr:`Family.token_types`)."""

    def forward(self, inputs_embeds: torch.Tensor, image_blocks: torch.Tensor, attention_mask: torch.Tensor,
                position_ids: torch.Tensor | None = None, past_length: torch.Tensor | None = None,
                cache: tuple[tuple[torch.Tensor, torch.Tensor], ...] | None = None) -> dict[str, Any]:
        return self._step({"inputs_embeds": inputs_embeds, "image_blocks": image_blocks}, attention_mask,
                          position_ids, past_length, cache)


# ── planning ────────────────────────────────────────────────────────────────────────────────────────────
def _family(model: Any, task: str) -> Family:
    name, media = type(model).__name__, "audio" if task == AUDIO_TEXT_TO_TEXT else "image"
    families = [family for family, kind in FAMILIES.items() if kind.media == media]
    if name not in families:
        raise InvalidInputError(
            f"{name} cannot be exported for task {task!r}: hfexport merges {media} embeddings for "
            f"{', '.join(families)} so far; export its language model with task='text-generation' instead")
    return FAMILIES[name]


def _audio_shape(model: Any) -> list[int]:
    """``[mels, frames]`` of one chunk: the audio encoder's fixed input (``num_mel_bins`` by twice
    ``max_source_positions``, the frames its two convolutions halve once)."""
    audio = model.config.audio_config
    return [int(audio.num_mel_bins), 2 * int(audio.max_source_positions)]


def _image_shape(model: Any) -> tuple[int, int, int]:
    """``(channels, height, width)`` of the images the model's processor makes: ``vision_config.image_size``."""
    vision = model.config.vision_config
    size = vision.image_size
    height, width = (size, size) if isinstance(size, int) else tuple(size)
    return int(getattr(vision, "num_channels", 3)), int(height), int(width)


def _anyres_section(model: Any, max_images: int) -> dict[str, Any]:
    """The manifest's ``vision.anyres`` of a LLaVA-NeXT/OneVision model: what ``generate`` needs to cut each image
    into crops and lay their features out as the model's ``pack_image_features`` (the config's grid pinpoints, the
    tile's size and its tokens a side, OneVision's ``anyres_max_<n>`` and its one-crop images in prompts of
    several), and ``max_crops``, the ``vision`` program's bound: ``max_images`` images of the most tiles a pinpoint
    gives, plus the base crop each."""
    config, vision = model.config, model.config.vision_config
    tile = int(vision.image_size)
    pinpoints = [[int(h), int(w)] for h, w in config.image_grid_pinpoints]
    onevision = hasattr(config, "vision_aspect_ratio")
    return {"grid_pinpoints": pinpoints, "tile": tile, "tokens_per_side": tile // int(vision.patch_size),
            "max_tiles_ratio": int(config.vision_aspect_ratio.removeprefix("anyres_max_")) if onevision else None,
            "one_crop_when_several": onevision,  # OneVision: batch_num_images > 1 -> base crops only
            "max_crops": max_images * (1 + max(-(-h // tile) * -(-w // tile) for h, w in pinpoints))}


def _static_grid(model: Any, grid_thw: Any) -> tuple[tuple[int, int, int], list[int], list[int]]:
    """Qwen2-VL's static grid ``(1, h, w)`` in patches, the vision program's ``[patches, patch_dim]`` and the image
    size ``[height, width]`` in pixels: the example's ``image_grid_thw`` (every image the same), else the smallest
    image the model's processor makes (``2 * spatial_merge_size`` patches a side: 56x56 pixels for the released
    models, whose processor resizes to a multiple of ``patch_size * spatial_merge_size``).

    Raises:
        hfexport.InvalidInputError: an ``image_grid_thw`` that is not one still image's grid repeated.
    """
    vision = model.config.vision_config
    merge, patch = int(vision.spatial_merge_size), int(vision.patch_size)
    grid = (1, 2 * merge, 2 * merge)
    if grid_thw is not None:
        rows = {tuple(row) for row in torch.as_tensor(grid_thw).reshape(-1, 3).tolist()}
        if len(rows) != 1 or next(iter(rows))[0] != 1 or any(side % merge for side in next(iter(rows))[1:]):
            raise InvalidInputError(f"the example image_grid_thw must give one grid (1, h, w), h and w multiples of "
                                    f"spatial_merge_size={merge}, to every image (the export's static image size), "
                                    f"got {sorted(rows)}")
        grid = next(iter(rows))
    patch_dim = int(vision.in_channels) * int(vision.temporal_patch_size) * patch * patch
    return grid, [grid[0] * grid[1] * grid[2], patch_dim], [grid[1] * patch, grid[2] * patch]


def plan_image_text(model: Any, inputs: Mapping[str, Any] | None = None, *, task: str = IMAGE_TEXT_TO_TEXT,
                    max_cache_len: int | None = None, max_batch: int | None = None, prefill_chunk: int | None = None,
                    max_images: int | None = None, stateful: bool = False, fused_cache_attention: Any = False) -> Any:
    """The ``vision``, ``embed`` and ``decoder`` components of a vision-language model (see the module docstring);
    for ``task="audio-text-to-text"``, the ``audio``, ``embed`` and ``decoder`` components of an audio-language
    model (Voxtral: :class:`AudioStep`; at most ``max_batch`` chunks per call).

    Args:
        model: a ``...ForConditionalGeneration`` of :data:`FAMILIES`.
        inputs: an example ``{"input_ids", "attention_mask", "pixel_values"}`` (``"input_features"`` for audio;
            each optional); default: seeded.
        max_cache_len, max_batch, prefill_chunk, stateful, fused_cache_attention: as for ``"text-generation"``
            (:func:`hfexport_dynamo.tasks.causal_lm.plan_causal_lm`).
        max_images: the most images one call of ``generate`` takes, the whole batch's (default ``max_batch``: one
            image per prompt). LLaVA-NeXT/OneVision's ``vision`` program takes up to ``max_images`` times the most
            crops an image has (its base crop and the most tiles a grid pinpoint gives): ``max_crops``.

    Raises:
        hfexport.InvalidInputError: a model of another family, or example inputs of the wrong kind.
        ValueError: bounds the model cannot take (says which).
    """
    from torch.export import Dim

    from hfexport.plugin import ComponentPlan, TaskPlan

    family = _family(model, task)
    inner = getattr(model, family.inner)
    max_cache_len, max_batch = checked_bounds(model, max_cache_len, max_batch)
    prefill_chunk = check_prefill_chunk(prefill_chunk, max_cache_len)
    if max_images is not None and family.media == "audio":
        raise TypeError(f"max_images is an option of task {IMAGE_TEXT_TO_TEXT!r}, not of {task!r}")
    max_images = max_batch if max_images is None else max_images
    if isinstance(max_images, bool) or not isinstance(max_images, int) or max_images < 1:
        raise ValueError(f"max_images must be an int >= 1, got {max_images!r}")
    inputs = dict(inputs or {})
    input_name = "input_features" if family.media == "audio" else "pixel_values"
    pixel_values = inputs.pop(input_name, None)
    grid_thw = inputs.pop("image_grid_thw", None)
    for name in ("pixel_attention_mask", "token_type_ids", "mm_token_type_ids"):
        inputs.pop(name, None)
    if (family.per_row or family.anyres) and isinstance(pixel_values, torch.Tensor) and pixel_values.dim() == 5:
        pixel_values = pixel_values.flatten(0, 1)  # anyres: the processor's [images, crops, C, H, W]
    ids, mask = example_prompt(model, inputs or None)
    if inputs and ids.shape[0] > max_batch:
        raise InvalidInputError(f"the example prompt has a batch of {ids.shape[0]}, beyond max_batch={max_batch}")
    grid = None
    if family.media == "audio":  # [chunks, mels, frames]
        shape = _audio_shape(model)
        height, width = shape
    elif family.encode == "patches":  # Qwen2-VL: [images, patches, patch_dim] at one grid
        grid, shape, (height, width) = _static_grid(model, grid_thw)
        if isinstance(pixel_values, torch.Tensor) and pixel_values.dim() == 2:  # the processor's packed patches
            pixel_values = pixel_values.reshape(-1, *shape) if pixel_values.shape[0] % shape[0] == 0 else pixel_values
    else:
        channels, height, width = _image_shape(model)
        shape = [channels, height, width]
    dtype = next((p.dtype for p in model.parameters() if p.is_floating_point()), torch.float32)
    anyres = _anyres_section(model, max_images) if family.anyres else None
    bound = anyres["max_crops"] if anyres else max_images  # the vision program's dim 0: crops of every image
    images = min(_TRACE_IMAGES, bound)
    if pixel_values is None:
        pixel_values = torch.randn(images, *shape, generator=torch.Generator().manual_seed(0))
    if not isinstance(pixel_values, torch.Tensor) or list(pixel_values.shape[1:]) != shape:
        raise InvalidInputError(f"the example {input_name} must be a tensor [items, {', '.join(map(str, shape))}] "
                                f"(the export's {family.media} size, {height}x{width}), got "
                                f"{list(getattr(pixel_values, 'shape', []))}")
    pixel_values = pixel_values[:images].to(dtype)
    if pixel_values.shape[0] < images:
        pixel_values = pixel_values[:1].repeat(images, *[1] * len(shape))

    vision = AudioStep(inner, family, model.config) if family.media == "audio" else \
        VisionStep(inner, family, model.config, grid)
    embed = TokenEmbedStep(model)
    lm = LanguageModelHead(model, inner, family.language)
    with torch.no_grad():
        (image_embeds,) = vision(pixel_values).values()
    tokens_per_image = (image_embeds.shape[0] - bool(anyres)) // images  # anyres: per crop, the newline after
    def tokens(t: torch.Tensor) -> dict[str, torch.Tensor]:
        if not family.token_types:
            return embed(t)
        blocks = torch.full_like(t, -1)
        blocks[:, 1:1 + min(3, t.shape[1] - 1)] = 0  # an image block, so that the example exercises its mask
        return {**embed(t), "image_blocks": blocks}

    decoder, cache = plan_decoder(lm, ids, mask, max_cache_len=max_cache_len, max_batch=max_batch,
                                  prefill_chunk=prefill_chunk, stateful=stateful,
                                  # a runtime's fused attention is causal only (ONNX Runtime's GroupQueryAttention,
                                  # ExecuTorch's custom_sdpa): an image block's bidirectional mask needs the plain one
                                  fused_cache_attention=False if family.token_types else fused_cache_attention,
                                  embed=tokens, position_rows=3 if family.mrope else None,
                                  step_class=ImageBlocksLMStep if family.token_types else EmbedsLMStep)
    rows = 1 if max_batch == 1 else 2
    embed_ids = ids[:1].repeat(rows, 1) if ids.shape[0] < rows else ids[:rows]
    batch = {0: Dim("batch", min=1, max=max_batch)} if rows > 1 else {}
    components = [
        ComponentPlan(AUDIO if family.media == "audio" else VISION, vision, {input_name: pixel_values},
                      {input_name: {0: Dim("chunks" if family.media == "audio" else "crops" if anyres else "images",
                                           min=1, max=bound)} if images > 1 else None}),
        ComponentPlan(EMBED, embed, {"input_ids": embed_ids},
                      {"input_ids": {**batch, 1: Dim("seq", min=1, max=max_cache_len)}}),
        decoder,
    ]
    section = generation_manifest(model, max_cache_len, max_batch, len(cache["row_shapes"]))
    section.update(prefill_chunk=prefill_chunk, cache=cache)
    if family.media == "audio":
        section["audio"] = {"inputs": [input_name], "input_features_shape": shape,
                            "dtype": str(dtype).removeprefix("torch."),
                            "audio_token_id": int(model.config.audio_token_id),
                            "tokens_per_chunk": int(tokens_per_image), "max_audio_chunks": max_images}
        return TaskPlan(task, components, manifest={"generation": section}, model=model)
    section.update(vision={
        "inputs": ["pixel_values", *(["pixel_attention_mask"] if family.per_row else []),
                   *(["image_sizes"] if anyres else []),
                   *(["batch_num_images"] if anyres and anyres["one_crop_when_several"] else []),
                   *(["token_type_ids"] if family.token_types else []),
                   *(["image_grid_thw", "mm_token_type_ids"] if family.mrope else [])],
        "pixel_values_shape": shape,
        # [batch, images, C, H, W] with all-zero padding images (generate drops them), or [images, C, H, W]
        "per_row": family.per_row,
        "token_types": family.token_types,  # the decoder takes image_blocks (Gemma 3's bidirectional images)
        # Qwen2-VL: the processor's packed patches [images * patches, patch_dim] at one grid (t, h, w)
        **({"patches": True, "grid_thw": list(grid),
            "spatial_merge_size": int(model.config.vision_config.spatial_merge_size)} if grid is not None else {}),
        **({"mrope": True} if family.mrope else {}),  # the decoder's position_ids are [3, batch, seq]
        # LLaVA-NeXT/OneVision: pixel_values are crops, tokens_per_image a crop's; generate lays each image out
        **({"anyres": anyres} if anyres else {}),
        "image_size": [height, width],
        "dtype": str(dtype).removeprefix("torch."),
        "image_token_id": int(model.config.image_token_id),
        "tokens_per_image": int(tokens_per_image),
        "max_images": max_images,
    })
    return TaskPlan(IMAGE_TEXT_TO_TEXT, components, manifest={"generation": section}, model=model)
