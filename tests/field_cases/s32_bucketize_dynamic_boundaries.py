"""S32 (sibling of d04, non-Core-ATen ops on ExecuTorch): ``torch.bucketize`` against boundaries given as an input
(their values change between calls, the number of values bucketized is dynamic), left-closed (``right=False``) with ``out_int32=True`` and right-closed, with values that sit exactly on a
boundary or are NaN (eager puts NaN in the last bucket). hfexport's comparison-and-sum decomposition would
also take a dynamic number of boundaries, but ONNX's (torch._refs, a Python loop over log2 of it) does not.
"""
import torch
from torch.export import Dim


class DistanceBuckets(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(16, 4)

    def forward(self, distances, boundaries):
        buckets = torch.bucketize(distances, boundaries, out_int32=True)
        closed = torch.bucketize(distances, boundaries, right=True)
        return buckets, self.emb(buckets.long()) * (closed.unsqueeze(-1) + 1)


DYNAMIC_SHAPES = ({1: Dim("n_dist", min=2, max=64)}, {})


def _case(n, bounds):
    distances = torch.linspace(-1.0, 4.0, n).repeat(2, 1)
    distances[0, 1] = float("nan")
    distances[1, 2] = bounds[1]  # on a boundary
    inputs = {"distances": distances, "boundaries": torch.tensor(bounds)}
    torch.manual_seed(0)
    with torch.no_grad():
        expected = DistanceBuckets()(**inputs)
    return inputs, expected


def build():
    inputs, expected = _case(9, [0.0, 0.5, 1.0, 2.0])
    torch.manual_seed(0)
    return DistanceBuckets().eval(), inputs, expected


def ALT_INPUTS():
    return _case(13, [-0.5, 0.25, 1.0, 3.5])


if __name__ == "__main__":
    print(build()[2][0])
