"""S85 (sibling of the input-mutation kind: OpenVINO refused it, ExecuTorch returned the new value as an extra
output): forward scales a view of its `state` input in place (`state[:, :2].mul_(0.5)`) and adds to it, then reads
it; eager changes the caller's tensor, and so does each runner that writes the new value back.

Expected: eager (2, 4).
"""
import torch


class DecayState(torch.nn.Module):
    def forward(self, x, state):
        state[:, :2].mul_(0.5)
        state.add_(x)
        return state * 2.0 + 1.0


def build():
    gen = torch.Generator().manual_seed(16)
    inputs = {"x": torch.randn(2, 4, generator=gen), "state": torch.randn(2, 4, generator=gen)}
    model = DecayState().eval()
    with torch.no_grad():
        expected = model(inputs["x"], inputs["state"].clone())
    return model, inputs, expected
