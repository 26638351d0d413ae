"""E11: Swin window attention with padding to a multiple of the window on a dynamic image size (tiny SwinModel)
(huggingface/optimum#1810, https://github.com/huggingface/optimum/issues/1810, open, "[Tracking] TorchDynamo ONNX
exporter issues": hf-internal-testing/tiny-random-SwinModel fails with `Unsupported FX nodes: {'call_function':
['<built-in function mod>', ...]}`; the same `pad = (window - W % window) % window` pattern is the Swin code quoted
in pytorch/pytorch#56355).

`SwinLayer.maybe_pad` pads the (H/4, W/4) patch grid up to a multiple of window_size=2 with `F.pad` amounts computed
from symbolic sizes; `SwinPatchMerging.maybe_pad` pads odd grids before merging; shifted windows use `torch.roll`
and an attention mask built from the padded size. Height and width are separate dynamic dims (multiples of 4).

Expected: eager last_hidden_state and pooler_output at 28x36 pixels (7x9 patches, both odd), and from the same
program at 20x44 (5x11 patches).
"""
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
import torch
from torch.export import Dim
from transformers import SwinConfig, SwinModel

H, W = Dim("h", min=2, max=32), Dim("w", min=2, max=32)
DYNAMIC_SHAPES = {"pixel_values": {2: 4 * H, 3: 4 * W}}
REF_CONFIG = {"dynamic_shapes": DYNAMIC_SHAPES}


def _model():
    torch.manual_seed(0)
    cfg = SwinConfig(image_size=32, patch_size=4, num_channels=3, embed_dim=16, depths=[2, 1], num_heads=[2, 2],
                     window_size=2, mlp_ratio=2.0, drop_path_rate=0.0)
    return SwinModel(cfg).eval()


def _inputs(model, h, w):
    inputs = {"pixel_values": torch.randn(1, 3, h, w, generator=torch.Generator().manual_seed(h * 100 + w))}
    with torch.no_grad():
        out = model(**inputs)
    return inputs, (out.last_hidden_state, out.pooler_output)


def build():
    model = _model()
    return (model, *_inputs(model, 28, 36))


def ALT_INPUTS():
    return _inputs(_model(), 20, 44)
