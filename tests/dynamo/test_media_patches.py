"""Issue 47: ``_media_patches``, the dynamo patches that keep a program's media dims what its manifest claims.

* ``_patch_llava_image_features_stay_batched``: LLaVA's ``list(image_features)`` fixed the number of images at the
  traced one; with the patch the ``vision`` program takes 1 to ``max_images`` images, without it the export is
  refused by the verification at one image (the smallest shape of the range).
* ``_patch_position_interpolation_always``: the ViT kind's ``if num_patches == num_positions: return table``
  shortcut specialized the image size; with the patch the program equals eager at other sizes.

The cheap tests run on dynamo; the matrix of sizes and backends is slow."""

from __future__ import annotations

import pytest
import torch

import hfexport
from helpers import tiny_model

ATOL, RTOL = 1e-4, 1e-3


def _llava_image_features(model: torch.nn.Module, pixel_values: torch.Tensor) -> torch.Tensor:
    """Eager (unpatched) LLaVA's image features of ``pixel_values``, concatenated over the images."""
    with torch.no_grad():
        return torch.cat(model.model.get_image_features(pixel_values=pixel_values).pooler_output)


def test_llava_vision_program_takes_every_image_count_up_to_max_images():
    model = tiny_model("llava", seed=7, vision_config=dict(model_type="clip_vision_model", hidden_size=24,
                                                            intermediate_size=40, num_hidden_layers=1,
                                                            num_attention_heads=2, image_size=24, patch_size=6))
    exported = hfexport.export(model, backend="dynamo", task="image-text-to-text", max_batch=2, max_cache_len=40,
                               max_images=3)
    assert "_patch_llava_image_features_stay_batched" in str(exported.manifest["workarounds"]["patches"])
    verification = exported.manifest["components"]["vision"]["verification"]
    assert verification["smallest_shape"]["passed"] is True, verification
    assert verification["smallest_shape"]["inputs"] == {"pixel_values": [1, 3, 24, 24]}
    images = torch.randn(3, 3, 24, 24, generator=torch.Generator().manual_seed(2))
    for count in (1, 2, 3):
        got = exported.run("vision", pixel_values=images[:count])["image_embeds"]
        torch.testing.assert_close(got, _llava_image_features(model, images[:count]), atol=1e-5, rtol=1e-4)


def test_llava_without_the_patch_is_refused_at_export_at_one_image():
    """The field case: traced at 2 images in [1, 2], the program failed at 1 (``unbind[1]``) although its manifest
    claimed [1, 2]; the second-shape check's smallest shape now refuses it at export."""
    with pytest.raises(hfexport.ExportError, match=r"verification at the smallest shape \(pixel_values=\[1, 3, 32, "
                                                   r"32\]\) failed for LlavaForConditionalGeneration \(vision program\): IndexError") as caught:
        hfexport.export(tiny_model("llava"), backend="dynamo", task="image-text-to-text", max_batch=2,
                        max_cache_len=40, disable=("_patch_llava_image_features_stay_batched",))
    assert "list() or unbind over images" in str(caught.value)


def dinov2(seed: int = 0) -> torch.nn.Module:
    """A seeded DINOv2 of 2-pixel patches trained at 30x30 (15x15 patches), sizes unlike the other tests'."""
    import transformers as tf

    torch.manual_seed(seed)
    return tf.Dinov2Model(tf.Dinov2Config(hidden_size=24, num_hidden_layers=1, num_attention_heads=2,
                                          intermediate_size=40, image_size=30, patch_size=2)).eval()


def vit(seed: int = 0) -> torch.nn.Module:
    """A seeded ViT of 4-pixel patches trained at 28x28, run with ``interpolate_pos_encoding=True``."""
    import transformers as tf

    torch.manual_seed(seed)
    return tf.ViTModel(tf.ViTConfig(hidden_size=24, num_hidden_layers=1, num_attention_heads=2, intermediate_size=40,
                                    image_size=28, patch_size=4), add_pooling_layer=False).eval()


def siglip(seed: int = 0) -> torch.nn.Module:
    """A seeded SigLIP vision tower (no class token) of 4-pixel patches trained at 24x24, without its attention
    pooling head (its nn.MultiheadAttention traces a guard that refuses one image on dynamo: left to its own issue)."""
    import transformers as tf

    torch.manual_seed(seed)
    return tf.SiglipVisionModel(tf.SiglipVisionConfig(hidden_size=24, num_hidden_layers=1, num_attention_heads=2,
                                                      intermediate_size=40, image_size=24, patch_size=4,
                                                      vision_use_head=False)).eval()


def deit(seed: int = 0) -> torch.nn.Module:
    """A seeded DeiT (a class and a distillation token before the patches) of 4-pixel patches trained at 20x20,
    run with ``interpolate_pos_encoding=True``."""
    import transformers as tf

    torch.manual_seed(seed)
    config = tf.DeiTConfig(hidden_size=24, num_hidden_layers=1, num_attention_heads=2, intermediate_size=40,
                           image_size=20, patch_size=4)
    return tf.DeiTModel(config, add_pooling_layer=False).eval()


def clip(seed: int = 0) -> torch.nn.Module:
    """A seeded CLIP vision tower (its position table an ``nn.Embedding``) of 4-pixel patches trained at 32x32, run
    with ``interpolate_pos_encoding=True``."""
    import transformers as tf

    torch.manual_seed(seed)
    return tf.CLIPVisionModel(tf.CLIPVisionConfig(hidden_size=24, num_hidden_layers=1, num_attention_heads=2,
                                                  intermediate_size=40, image_size=32, patch_size=4)).eval()


FAMILIES = {"dinov2": (dinov2, 30, {}), "vit": (vit, 28, {"interpolate_pos_encoding": True}),
            "siglip": (siglip, 24, {"interpolate_pos_encoding": True}),
            "deit": (deit, 20, {"interpolate_pos_encoding": True}),
            "clip": (clip, 32, {"interpolate_pos_encoding": True})}


def _export(kind: str, backend: str, **options):
    build, size, fixed = FAMILIES[kind]
    model = build()
    x = torch.randn(2, 3, size, size, generator=torch.Generator().manual_seed(1))
    exported = hfexport.export(model, {"pixel_values": x}, backend=backend,
                               dynamic_shapes={"pixel_values": {0: torch.export.Dim("batch", min=1, max=4),
                                                                2: torch.export.Dim("height", min=8, max=64),
                                                                3: torch.export.Dim("width", min=8, max=64)}},
                               **({"fixed_kwargs": fixed} if fixed else {}), **options)
    return model, exported, size, fixed


def _compare(model, exported, fixed, height: int, width: int, images: int = 1) -> None:
    x = torch.randn(images, 3, height, width, generator=torch.Generator().manual_seed(height * 100 + width))
    with torch.no_grad():
        expected = model(pixel_values=x, **fixed).last_hidden_state
    got = exported(pixel_values=x)["last_hidden_state"]
    torch.testing.assert_close(got, expected, atol=ATOL, rtol=RTOL, msg=lambda m: f"at {height}x{width}: {m}")


def test_dinov2_at_other_image_sizes_equals_eager():
    model, exported, size, fixed = _export("dinov2", "dynamo")
    assert "_patch_position_interpolation_always" in str(exported.manifest["workarounds"]["patches"])
    for height, width in ((size, size), (40, 40), (20, 36)):
        _compare(model, exported, fixed, height, width)


@pytest.mark.parametrize("kind", ["dinov2", pytest.param("deit", marks=pytest.mark.slow),
                                  pytest.param("clip", marks=pytest.mark.slow)])
def test_without_the_patch_the_vit_kind_is_refused_at_export(kind):
    """DINOv2, DeiT and CLIP each take the shortcut at the trained size: the program's guard pins the patch count."""
    with pytest.raises(hfexport.ExportError, match=r"verification at (a second|the smallest) shape .* Guard failed: "
                                                   r"pixel_values.size\(\)\[2\] // \d"):
        _export(kind, "dynamo", disable=("_patch_position_interpolation_always",))


def test_the_interpolation_at_the_trained_size_is_the_table_exactly():
    """What the patch relies on: bicubic from n x n to n x n is the identity, bit for bit."""
    model = dinov2()
    embeddings = model.embeddings
    table = embeddings.position_embeddings
    tokens = torch.zeros(1, table.shape[1], table.shape[2])
    from hfexport_dynamo._media_patches import _patch_position_interpolation_always

    patched = _patch_position_interpolation_always(torch.jit.is_tracing)
    original = torch.jit.is_tracing
    torch.jit.is_tracing = patched
    try:
        interpolated = embeddings.interpolate_pos_encoding(tokens, 30, 30)
    finally:
        torch.jit.is_tracing = original
    assert torch.equal(interpolated, table)


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["dynamo", "onnx", "executorch-xnnpack", "openvino"])
@pytest.mark.parametrize("kind", list(FAMILIES))
def test_vit_kind_at_three_image_sizes_on_every_backend(kind, backend):
    """DINOv2 and four siblings of the kind (ViT, SigLIP, DeiT, CLIP), each at its trained size, a larger and a
    non-square smaller one, and with one image (below the traced two)."""
    model, exported, size, fixed = _export(kind, backend)
    for height, width in ((size, size), (size + 12, size + 12), (size - 8, size + 4)):
        _compare(model, exported, fixed, height, width)
    _compare(model, exported, fixed, size + 12, size - 4, images=1)
