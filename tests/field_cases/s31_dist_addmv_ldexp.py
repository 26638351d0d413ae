"""S31 (sibling of d04, non-Core-ATen ops on ExecuTorch): ``torch.dist``, ``torch.addmv`` and ``torch.ldexp`` (a
distance feature, a bias plus matrix-vector product, and a power-of-two scale). None is Core ATen or has a
portable kernel; each has an aten-level torch._decomp decomposition that ExecuTorch's own table leaves out.
hfexport adds those (it once added none: torch's ``CustomDecompTable`` ignores ``setdefault``).
"""
import torch


class Features(torch.nn.Module):
    def __init__(self):
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.w = torch.nn.Parameter(torch.randn(4, 6, generator=g))
        self.b = torch.nn.Parameter(torch.randn(4, generator=g))
        self.anchor = torch.nn.Parameter(torch.randn(6, generator=g))

    def forward(self, x, exponent):
        projected = torch.addmv(self.b, self.w, x, beta=0.5, alpha=2.0)
        return torch.ldexp(projected, exponent) + torch.dist(x, self.anchor, p=2)


def build():
    model = Features().eval()
    inputs = {"x": torch.randn(6, generator=torch.Generator().manual_seed(1)),
              "exponent": torch.tensor([0, 1, -1, 3])}
    with torch.no_grad():
        expected = model(**inputs)
    return model, inputs, expected


if __name__ == "__main__":
    print(build()[2])
