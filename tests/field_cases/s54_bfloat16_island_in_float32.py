"""S54 (sibling of e05, dtypes a CPU runtime cannot run): a float32 model with a bfloat16 island, a projection kept
in bfloat16 (``inner.to(torch.bfloat16)``, the mixed-precision adapter pattern): ``x.to(bfloat16)``, a bfloat16
``Linear`` and ``GELU``, then ``.float()`` into a float32 LayerNorm and head. Batch is dynamic. ONNX Runtime's CPU
has no bfloat16 ``MatMul``.

Expected: eager float32 output within bfloat16 tolerance (the island rounds to 8 significant bits).
"""
import torch
from torch.export import Dim

DYNAMIC_SHAPES = ({0: Dim("batch", min=2, max=16)},)
TOL = (2e-2, 2e-2)
HF_OPTIONS = {"atol": 2e-2, "rtol": 2e-2}


class Island(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU()).to(torch.bfloat16)
        self.norm, self.head = torch.nn.LayerNorm(16), torch.nn.Linear(16, 3)

    def forward(self, x):
        h = self.inner(x.to(torch.bfloat16)).float()
        return self.head(self.norm(h))


def _model():
    torch.manual_seed(0)
    return Island().eval()


def _inputs(b):
    inputs = {"x": torch.randn(b, 8, generator=torch.Generator().manual_seed(b))}
    with torch.no_grad():
        return inputs, _model()(**inputs)


def build():
    return (_model(), *_inputs(3))


def ALT_INPUTS():
    return _inputs(6)
