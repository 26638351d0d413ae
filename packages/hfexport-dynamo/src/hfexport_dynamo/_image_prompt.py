"""The merge of images into an image-text-to-text prompt on a loaded artifact (what the model's ``forward`` does
before its language model), for :func:`hfexport_dynamo.generation.generate`; the programs are planned by
:mod:`hfexport_dynamo._image_text`."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch

__all__ = ["EMBED", "VISION", "image_prompt"]

VISION, EMBED = "vision", "embed"  # the component names (the decoder's is generation.DECODER)


def image_prompt(exported: Any, section: Mapping[str, Any], input_ids: torch.Tensor, media: Mapping[str, Any]
                 ) -> tuple[torch.Tensor, Callable[[torch.Tensor], torch.Tensor], dict[str, torch.Tensor]]:
    """The prompt's ``inputs_embeds`` with the images' embeddings at the image token's positions, as the model's
    ``forward`` merges them, and the decode steps' embedding of new ids.

    Args:
        exported: an artifact of task ``"image-text-to-text"``.
        section: its manifest's ``generation`` section.
        input_ids: ``int64 [batch, prompt]``, checked (:func:`hfexport_dynamo._decoding.check_prompt`); each image
            is ``tokens_per_image`` positions of ``image_token_id``, in the order of the images.
        media: ``{"pixel_values": float [images, channels, height, width]}``; where the manifest says ``per_row``
            (Idefics3, SmolVLM), ``[batch, images, channels, height, width]`` with all-zero padding images, dropped
            as the model drops them, and optionally ``pixel_attention_mask`` ``[batch, images, height, width]``
            (only full images are taken); Gemma 3 optionally ``token_type_ids`` ``[batch, prompt]`` (checked: 1 at
            the image tokens). Nothing: a prompt without images.

    Returns:
        ``(inputs_embeds float [batch, prompt, hidden], embed, per_position)`` where ``embed(ids [batch, 1])`` runs
        the ``embed`` program, and ``per_position`` holds the decoder's other prompt inputs: ``image_blocks``
        ``int64 [batch, prompt]`` (each image's index in its row at its tokens, -1 elsewhere: transformers'
        ``get_block_sequence_ids_for_mask``) where the manifest says ``token_types`` (Gemma 3: image tokens attend
        to their whole image).

    Raises:
        TypeError: ``pixel_values`` is not a float tensor of rank 4 (5 where ``per_row``).
        ValueError: another image size than the export's, more images than ``max_images``, an image with masked
            pixels, a number of image tokens that is not ``images x tokens_per_image``, or (``token_types``) a
            prompt longer than ``prefill_chunk`` (each says which), before any program runs.
    """
    vision = section["vision"]
    token, per_image = vision["image_token_id"], vision["tokens_per_image"]
    pixel_values = media.get("pixel_values")
    image_tokens = int((input_ids == token).sum())
    images = 0
    if pixel_values is not None:
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
    if image_tokens != images * per_image:
        raise ValueError(f"input_ids hold {image_tokens} image tokens (id {token}) for {images} image(s) of "
                         f"{per_image} tokens each: put {per_image} image tokens per image in the prompt, as the "
                         "model's processor does")

    per_position = {}
    if vision.get("token_types"):  # the decoder's bidirectional image blocks are read within one prefill call
        if input_ids.shape[1] > section["prefill_chunk"]:
            raise ValueError(f"a prompt of {input_ids.shape[1]} tokens exceeds this export's prefill_chunk="
                             f"{section['prefill_chunk']}: its image tokens attend to their whole image, which one "
                             "prefill call must hold; shorten the prompt or export with a larger prefill_chunk")
        is_image = input_ids == token
        starts = is_image & ~torch.nn.functional.pad(is_image, (1, 0))[:, :-1]
        per_position["image_blocks"] = torch.where(is_image, starts.long().cumsum(-1) - 1, -1)
        types = media.get("token_type_ids")  # the processor's: 1 at image tokens (read from the ids here)
        if types is not None and not torch.equal(torch.as_tensor(types).long(), is_image.long()):
            raise ValueError("token_type_ids must be 1 exactly at the image tokens (id "
                             f"{token}), as the model's processor makes them; or leave them out")

    def embed(ids: torch.Tensor) -> torch.Tensor:
        return exported.run(EMBED, input_ids=ids)["inputs_embeds"]

    embeds = embed(input_ids)
    if images:
        features = exported.run(VISION, pixel_values=pixel_values.to(embeds.dtype))["image_embeds"]
        embeds = embeds.masked_scatter((input_ids == token)[..., None], features.to(embeds.dtype))
    return embeds, embed, per_position
