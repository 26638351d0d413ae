"""S61 (sibling of e11, a dynamic spatial size padded to a multiple of the window): a tiny Donut-Swin encoder
(``DonutSwinModel``, its own copy of Swin's layers) with dynamic height and width, batch 2, traced at an even grid
(8x6 patches) and run at an odd one (5x7): the reverse direction of e11 and s60.
"""
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
import torch
from torch.export import Dim
from transformers import DonutSwinConfig, DonutSwinModel

H, W = Dim("h", min=2, max=16), Dim("w", min=2, max=16)
DYNAMIC_SHAPES = {"pixel_values": {2: 4 * H, 3: 4 * W}}


def _model():
    torch.manual_seed(0)
    cfg = DonutSwinConfig(image_size=32, patch_size=4, num_channels=3, embed_dim=8, depths=[2, 2], num_heads=[1, 2],
                          window_size=2, mlp_ratio=2.0, drop_path_rate=0.0)
    return DonutSwinModel(cfg).eval()


def _inputs(model, h, w):
    inputs = {"pixel_values": torch.randn(2, 3, h, w, generator=torch.Generator().manual_seed(h * 100 + w))}
    with torch.no_grad():
        out = model(**inputs)
    return inputs, (out.last_hidden_state, out.pooler_output)


def build():
    model = _model()
    return (model, *_inputs(model, 32, 24))


def ALT_INPUTS():
    return _inputs(_model(), 20, 28)
