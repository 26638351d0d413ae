"""Model patches (stage 2, ``"dynamo"`` scope) that keep a program's media dims what the manifest claims: the number
of images dynamic where transformers splits the encoded images per image with a Python ``list()``, and the image
size dynamic where a vision embedding returns its position table unchanged when the patch count is the trained one.
Each names the model-side change it waits for; ``disable=("<patch name>",)`` brings the original failure back (the
tests do: ``tests/dynamo/test_media_patches.py``).

Importing this module registers the patches (``capture`` imports it).
"""

from __future__ import annotations

import sys
from typing import Any

import torch

from hfexport.plugin import register_patch

__all__: list[str] = []


@register_patch("dynamo", "transformers.models.llava.modeling_llava.LlavaModel.get_image_features")
def _patch_llava_image_features_stay_batched(original: Any) -> Any:
    """LLaVA's ``get_image_features`` returning the projected images as one tensor, not a Python list per image.

    **Why**: without ``image_sizes``, ``LlavaModel.get_image_features`` ends with ``image_features =
    list(image_features)``: a Python list over the images' dim, which the trace unrolls for the traced count. The
    program then holds ``unbind[0] ... unbind[n-1]`` for ``n`` traced images: a ``[1, n]`` range exports and fails
    at one image (``IndexError`` in ``unbind[1]``), a wider range fails the export (``Constraints violated
    (images)``). Here ``pooler_output`` is a one-tensor tuple ``(features.flatten(0, 1),)`` ``[images * tokens,
    hidden]``: what its callers compute from the list (LLaVA's ``forward`` and hfexport's ``vision`` program
    ``torch.cat`` it over the images), with the count symbolic. With ``image_sizes`` (Pixtral towers) the model's
    ``torch.split`` by the sizes is kept. The LLaVA-NeXT and LLaVA-OneVision kin split by ``image_sizes`` (a
    data-dependent list of crops per image): hfexport does not trace that split, their ``vision`` program encodes
    all crops as one batch and ``generate`` lays each image out (``tasks.image_prompt.anyres_layout``).
    **Upstream**: model-side (transformers ``modeling_llava.py``), no issue filed.
    **Remove when**: transformers returns LLaVA's image features batched (or splits them with tensor ops).
    """
    module = sys.modules[original.__module__]

    def get_image_features(self: Any, pixel_values: torch.Tensor, vision_feature_layer: Any = None,
                           vision_feature_select_strategy: str | None = None, image_sizes: Any = None,
                           **kwargs: Any) -> Any:
        if image_sizes is not None:
            return original(self, pixel_values, vision_feature_layer=vision_feature_layer,
                            vision_feature_select_strategy=vision_feature_select_strategy, image_sizes=image_sizes,
                            **kwargs)
        image_outputs = self.vision_tower(pixel_values, return_dict=True, **kwargs)
        if isinstance(vision_feature_layer, int):
            selected = image_outputs.hidden_states[vision_feature_layer]
            if vision_feature_select_strategy == "default":
                selected = selected[:, 1:]
        else:
            pool = [image_outputs.hidden_states[layer] for layer in vision_feature_layer]
            if vision_feature_select_strategy == "default":
                pool = [hidden[:, 1:] for hidden in pool]
            selected = torch.cat(pool, dim=-1)
        features = self.multi_modal_projector(selected)  # [images, tokens, hidden]
        image_outputs.pooler_output = (features.flatten(0, 1),)
        return image_outputs

    # the original's decorators: config defaults for the feature layer and strategy, the hidden states that layer
    # selects captured, a tuple where return_dict=False
    get_image_features = module.merge_with_config_defaults(module.can_return_tuple(
        module.select_hidden_states("vision_feature_layer")(get_image_features)))
    get_image_features.__doc__ = original.__doc__
    return get_image_features


@register_patch("dynamo", "torch.jit.is_tracing")
def _patch_position_interpolation_always(original: Any) -> Any:
    """Vision embeddings' ``interpolate_pos_encoding`` interpolating at every image size, the trained one included.

    **Why**: the ViT kind's ``interpolate_pos_encoding`` (DINOv2, ViT, DeiT, Siglip, CLIP, and about fifty more in
    transformers, all by ``# Copied from``) starts with ``if not torch.jit.is_tracing() and num_patches ==
    num_positions and height == width: return self.position_embeddings``. torch.export is not a jit trace, so the
    shortcut is taken at the trained size: the program keeps the table unchanged and specializes its image size to
    the traced one (DINOv2 traced at 30x30 and run at 40x40: ``Guard failed: pixel_values.size()[2] // 2 *
    (pixel_values.size()[3] // 2) == 225``; on ONNX a broadcast error ``226 by 401``), while the manifest claims a
    range. Here ``torch.jit.is_tracing()`` answers True where its caller is an ``interpolate_pos_encoding``
    method, so that the code takes its jit-tracing branch and interpolates always: bicubic interpolation from
    ``n x n`` to ``n x n`` (``align_corners=False``) samples each position at its own centre with the weights
    ``(0, 1, 0, 0)``, the table exactly. Elsewhere it answers as torch does.
    **Upstream**: model-side (transformers' ``interpolate_pos_encoding`` tests ``torch.jit.is_tracing`` but not
    ``torch.compiler.is_exporting``), no issue filed.
    **Remove when**: transformers' shortcut also skips under ``torch.compiler.is_exporting()``.
    """

    def is_tracing() -> bool:
        caller = sys._getframe(1)
        return original() or caller.f_code.co_name == "interpolate_pos_encoding"

    return is_tracing
