"""S60 (sibling of e11, a dynamic spatial size padded to a multiple of the window): a tiny Swinv2Model with dynamic
height and width, traced at an odd patch grid (7x9) and run at an even one (6x8), so both the window padding and
the patch merging's odd-grid padding change parity between the two shapes. The range starts at a 5x5 patch grid: below
it the grid merged twice is 1x1, which the program's guard refuses (torch.export specializes a size of 1), and the
export's smallest-shape check refuses a range that claims it.
"""
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
import torch
from torch.export import Dim
from transformers import Swinv2Config, Swinv2Model

H, W = Dim("h", min=5, max=16), Dim("w", min=5, max=16)
DYNAMIC_SHAPES = {"pixel_values": {2: 4 * H, 3: 4 * W}}


def _model():
    torch.manual_seed(0)
    cfg = Swinv2Config(image_size=32, patch_size=4, num_channels=3, embed_dim=8, depths=[2, 1], num_heads=[1, 2],
                       window_size=2, mlp_ratio=2.0, drop_path_rate=0.0)
    return Swinv2Model(cfg).eval()


def _inputs(model, h, w):
    inputs = {"pixel_values": torch.randn(1, 3, h, w, generator=torch.Generator().manual_seed(h * 100 + w))}
    with torch.no_grad():
        out = model(**inputs)
    return inputs, (out.last_hidden_state, out.pooler_output)


def build():
    model = _model()
    return (model, *_inputs(model, 28, 36))


def ALT_INPUTS():
    return _inputs(_model(), 24, 32)
