"""E10: `masked_select` whose output length depends on the data (pytorch/executorch#13585,
https://github.com/pytorch/executorch/issues/13585, open, "ExecuTorch execution failed for masked_select.default":
`Attempted to resize a bounded tensor with a maximum capacity of 392 elements to 4368 elements`; ONNX side:
microsoft/onnxscript#1675, closed, "[torchlib] Implement aten.masked_select").

Keep the scores above a threshold (a detection / token-pruning pattern): `sel = scores.masked_select(scores > 0.5)`
gives an unbacked length u0 <= numel; the module returns the selected values (times a learned scale) and their
count. Input shape is static; the number of selected values differs between the two runs.

Expected: eager (selected values, count) for the traced input (count 11), and from the same program for a second
input of the same shape (count 5).
"""
import torch


class Threshold(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.scale = torch.nn.Parameter(torch.tensor(1.5))

    def forward(self, scores):
        sel = scores.masked_select(scores > 0.5)
        return sel * self.scale, (scores > 0.5).sum()


def _inputs(seed, count):
    g = torch.Generator().manual_seed(seed)
    scores = torch.rand(4, 6, generator=g) * 0.5
    idx = torch.randperm(24, generator=g)[:count]
    scores.view(-1)[idx] += 0.5
    inputs = {"scores": scores}
    with torch.no_grad():
        return inputs, Threshold().eval()(**inputs)


def build():
    return (Threshold().eval(), *_inputs(0, 11))


def ALT_INPUTS():
    return _inputs(1, 5)
