"""Dynamic ranges that fit real inputs (issue 26): an image traced small accepts twice its size where the model
allows (a size of 1 inside the model at the traced shape no longer bounds the input: hfexport_dynamo/tracer.py
``_widen_narrowed_dims``), and the roles and config sizes the ExecuTorch bounds come from
(``hfexport_dynamo.inputs.dim_roles``, ``typical_size``)."""

from __future__ import annotations

import copy

import pytest
import torch

import hfexport
from helpers import tiny_model
from hfexport_dynamo.inputs import dim_roles, typical_size

ATOL = 1e-4


def _pixels(batch: int, height: int, width: int, seed: int) -> dict[str, torch.Tensor]:
    return {"pixel_values": torch.randn(batch, 3, height, width, generator=torch.Generator().manual_seed(seed))}


@pytest.mark.parametrize("backend", ["dynamo", "onnx"])
def test_convnext_traced_at_32_runs_at_64(backend, tmp_path):
    """The tiny ConvNext (4 stages, 32x smaller at the end) traced at 32x32 is 1x1 at its last stage; torch.export
    bounded H and W to [32, 63] from it. The export now takes 64x64 and other sizes, equal to eager."""
    model = tiny_model("convnext")
    exported = hfexport.export(model, copy.deepcopy(_pixels(2, 32, 32, 0)), backend=backend, dynamic=True)
    dims = next(i for i in exported.manifest["inputs"] if i["name"] == "pixel_values")["dynamic_dims"]
    assert dims["2"]["min"] <= 32 and dims["2"]["max"] is None and dims["3"]["max"] is None
    assert any("size-oblivious" in note and "'pixel_values' dim 2 from [32, 63]" in note
               for note in exported.manifest["notes"])
    for inputs in (_pixels(3, 64, 64, 1), _pixels(2, 48, 40, 2), _pixels(2, 32, 32, 3)):
        report = exported.verify(copy.deepcopy(inputs), atol=ATOL, rtol=0.0)
        assert report.passed and report.max_abs_diff <= ATOL, str(report)
    if backend == "dynamo":  # the saved program loads with its (wider) range
        exported.save_pretrained(tmp_path / "convnext")
        loaded = hfexport.load(tmp_path / "convnext")
        report = loaded.verify(_pixels(3, 64, 64, 4), atol=ATOL, rtol=0.0, reference=model)
        assert report.passed, str(report)


class SameShrink(torch.nn.Module):
    """Three stride-2 convolutions, each after TF "SAME" padding computed from the size (as MobileNet's), each
    output plus its mean: 8x8 is 1x1 at the end."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.convs = torch.nn.ModuleList(torch.nn.Conv2d(4 if i else 3, 4, 3, stride=2) for i in range(3))

    def forward(self, pixel_values):
        x = pixel_values
        for conv in self.convs:
            pad_h, pad_w = 1 + (-x.shape[-2]) % 2, 1 + (-x.shape[-1]) % 2
            x = conv(torch.nn.functional.pad(x, (pad_w // 2, pad_w - pad_w // 2, pad_h // 2, pad_h - pad_h // 2)))
            x = x + x.mean(dim=(2, 3), keepdim=True)
        return x


def test_guards_that_refuse_larger_images_are_widened():
    """Traced at 8x8, the trace's guards (not its ranges) refused 16x16: ``Max(1, ...) > 1`` on the padded sizes
    of the 1x1 last stage. ``_widen_narrowed_dims`` checks the guards at twice the example's image size and traces
    again with size-oblivious guards; the program runs 16x16 and 9x12 equal to eager."""
    model = SameShrink().eval()
    exported = hfexport.export(model, _pixels(2, 8, 8, 0), backend="dynamo", dynamic=True)
    assert any("guards refused the example's images" in note for note in exported.manifest["notes"])
    for inputs in (_pixels(3, 16, 16, 1), _pixels(2, 9, 12, 2)):
        report = exported.verify(copy.deepcopy(inputs), atol=ATOL, rtol=0.0)
        assert report.passed and report.max_abs_diff <= ATOL, str(report)


def tiny_mobilenet_v2() -> torch.nn.Module:
    """The MobileNetV2 of Transformers' model tester (32x32 images, 32 times smaller at the end, TF "SAME" padding)."""
    import transformers as tf

    torch.manual_seed(0)
    return tf.MobileNetV2ForImageClassification(tf.MobileNetV2Config(
        image_size=32, depth_multiplier=0.25, depth_divisible_by=8, min_depth=8, expand_ratio=6, output_stride=32,
        first_layer_is_expansion=True, finegrained_output=True, hidden_act="relu6", num_labels=10)).eval()


@pytest.mark.slow  # ~15 s idle (39 s at load 3): 17 blocks traced twice; test_guards_that_refuse_larger_images_are_widened
def test_mobilenet_v2_traced_at_32_runs_at_64_and_odd_sizes():
    """MobileNetV2 traced at 32x32 runs 64x64 and 33x48, equal to eager. Two things kept its size at 32: its
    "SAME" padding reads the size as an int (``_patch_tf_same_padding_without_size_guard``; disabled, H and W are
    static), and its 1x1 last stage at 32x32 left guards on the padded sizes that refuse 64x64 (the guard check of
    ``_widen_narrowed_dims``, which traces again with size-oblivious guards and notes it)."""
    model = tiny_mobilenet_v2()
    exported = hfexport.export(model, copy.deepcopy(_pixels(2, 32, 32, 0)), backend="dynamo", dynamic=True)
    dims = next(i for i in exported.manifest["inputs"] if i["name"] == "pixel_values")["dynamic_dims"]
    assert set(dims) == {"0", "2", "3"}
    assert any("size-oblivious" in note and "guards refused the example's images" in note
               for note in exported.manifest["notes"])
    for inputs in (_pixels(3, 64, 64, 1), _pixels(2, 33, 48, 2), _pixels(2, 32, 32, 3)):
        report = exported.verify(copy.deepcopy(inputs), atol=ATOL, rtol=0.0)
        assert report.passed and report.max_abs_diff <= ATOL, str(report)
    with pytest.warns(UserWarning, match="dim 2 was asked to be dynamic but torch.export fixed it to 32"):
        unpatched = hfexport.export(model, copy.deepcopy(_pixels(2, 32, 32, 0)), backend="dynamo", dynamic=True,
                                    disable=("_patch_tf_same_padding_without_size_guard",), verify=False)
    assert "2" not in next(i for i in unpatched.manifest["inputs"] if i["name"] == "pixel_values")["dynamic_dims"]


def _audio(batch: int, seconds: float, seed: int) -> dict[str, torch.Tensor]:
    samples = int(16_000 * seconds)
    return {"input_values": torch.randn(batch, samples, generator=torch.Generator().manual_seed(seed)),
            "attention_mask": torch.ones(batch, samples, dtype=torch.long)}


@pytest.mark.parametrize("backend", ["dynamo", pytest.param("onnx", marks=pytest.mark.slow)])
def test_wav2vec2_one_and_five_seconds(backend):
    """Issue 26: a seeded 1-layer Wav2Vec2 whose convolutions shrink audio 320 times (as the real one's do) traced on
    1 s of audio runs 5 s at another batch, equal to eager (ExecuTorch: tests/executorch/test_executorch_bounds.py).
    ONNX is slow: the same behaviour as dynamo's, one more export."""
    import transformers as tf

    torch.manual_seed(0)
    model = tf.Wav2Vec2Model(tf.Wav2Vec2Config(
        hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=37, conv_dim=(8, 8),
        conv_kernel=(10, 8), conv_stride=(5, 64), num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=2,
        feat_extract_norm="layer", do_stable_layer_norm=True, vocab_size=32)).eval()
    exported = hfexport.export(model, _audio(2, 1, 0), backend=backend, dynamic=True)
    for inputs in (_audio(3, 5, 1), _audio(1, 2.5, 2)):
        report = exported.verify(copy.deepcopy(inputs), atol=ATOL, rtol=0.0)
        assert report.passed and report.max_abs_diff <= ATOL, str(report)


def test_a_range_the_model_bounds_is_kept():
    """A bound the model's code states (``torch._check``) survives the size-oblivious retrace: the program keeps
    it and no note claims a widening."""

    class AtMost40(torch.nn.Module):
        def forward(self, x):
            torch._check(x.shape[1] <= 40)
            return x * 2

    exported = hfexport.export(AtMost40(), {"x": torch.randn(2, 30)}, dynamic=True)
    dims = exported.manifest["inputs"][0]["dynamic_dims"]
    assert dims["1"]["max"] == 40
    assert not any("size-oblivious" in note for note in exported.manifest["notes"])


def test_dim_roles_of_images_audio_and_features():
    whisper = tiny_model("whisper", layers=1)  # num_mel_bins=16: [batch, 16, frames]
    roles = dim_roles({"input_features": torch.zeros(2, 16, 32), "decoder_input_ids": torch.zeros(2, 3)}, whisper)
    assert roles == {("input_features", 0): "batch", ("input_features", 2): "frames",
                     ("decoder_input_ids", 0): "batch", ("decoder_input_ids", 1): "decoder_sequence"}
    # [batch, frames, features] (Speech2Text's layout): the dim that is not the feature count
    assert dim_roles({"input_features": torch.zeros(2, 40, 16)}, whisper)[("input_features", 1)] == "frames"
    audio = dim_roles({"input_values": torch.zeros(2, 1024), "attention_mask": torch.ones(2, 1024)})
    assert audio[("input_values", 1)] == audio[("attention_mask", 1)] == "audio"
    text = dim_roles({"input_ids": torch.zeros(2, 7), "attention_mask": torch.ones(2, 7),
                      "input_values": torch.zeros(2, 7)})
    assert text[("attention_mask", 1)] == "sequence"  # a text mask stays a text mask
    pixels = dim_roles({"pixel_values": torch.zeros(2, 3, 32, 48)})
    assert pixels == {("pixel_values", 0): "batch", ("pixel_values", 2): "image_height",
                      ("pixel_values", 3): "image_width"}


def test_typical_sizes_from_the_config():
    import transformers as tf

    assert typical_size(tiny_model("bert", layers=1), "sequence") == (64, "config.max_position_embeddings")
    assert typical_size(tiny_model("whisper", layers=1), "frames") == (32, "2 * config.max_source_positions")
    assert typical_size(tiny_model("convnext", layers=1), "image_width") == (32, "config.image_size")
    wav2vec2 = tf.Wav2Vec2Model(tf.Wav2Vec2Config(hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                                  intermediate_size=37, conv_dim=(8,), conv_kernel=(10,),
                                                  conv_stride=(5,), num_conv_pos_embeddings=4,
                                                  num_conv_pos_embedding_groups=2))
    assert typical_size(wav2vec2, "audio") == (480_000, "30 s at 16 kHz")  # no sampling rate in its config
    wav2vec2.config.sampling_rate = 8_000
    assert typical_size(wav2vec2, "audio") == (240_000, "30 s at config.sampling_rate")
    assert typical_size(wav2vec2, "frames") == (3_000, "30 s of 10 ms frames")
