"""S78 (sibling of f01): a hand-written recurrence, `nn.GRUCell` and `nn.LSTMCell` stepped in a Python `for` loop
over the time axis (SLANet-style decoders). torch.export unrolls the loop, so the time axis is static (the traced
length): batch only is dynamic. A dynamic time axis needs `nn.GRU`/`nn.LSTM` (rewritten as a scan) or a `scan`.

Expected: eager outputs (2, 6, 5) and (2, 5), and from the same program at batch 4.
"""
import torch
from torch.export import Dim

DYNAMIC_SHAPES = {"x": {0: Dim("batch", min=1, max=8)}}


class CellLoop(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.gru = torch.nn.GRUCell(3, 5)
        self.lstm = torch.nn.LSTMCell(5, 5)

    def forward(self, x):
        h = x.new_zeros(x.shape[0], 5)
        hc = (x.new_zeros(x.shape[0], 5), x.new_zeros(x.shape[0], 5))
        outputs = []
        for t in range(x.shape[1]):
            h = self.gru(x[:, t], h)
            hc = self.lstm(h, hc)
            outputs.append(hc[0])
        return torch.stack(outputs, 1), hc[1]


def _model():
    torch.manual_seed(0)
    return CellLoop().eval()


def _inputs(b):
    inputs = {"x": torch.randn(b, 6, 3, generator=torch.Generator().manual_seed(b))}
    with torch.no_grad():
        return inputs, _model()(**inputs)


def build():
    return (_model(), *_inputs(2))


def ALT_INPUTS():
    return _inputs(4)
