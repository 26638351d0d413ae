"""``hfexport_dynamo.complex_to_real_pairs``: the rewritten program has no complex tensor and computes eager's
values (run as a torch program, no backend); what it cannot express fails with an error that names it."""

from __future__ import annotations

import pytest
import torch

from hfexport_dynamo import ComplexRewriteError, complex_to_real_pairs, involves_complex


def _rope(x, freqs):
    z = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
    return torch.view_as_real(z * freqs).flatten(-2).type_as(x)


class PolarRope(torch.nn.Module):  # Llama4 / DeepSeek-V2: freqs_cis from polar in forward, [b, h, s, d]
    def forward(self, x, positions):
        angles = positions[:, None, :, None] * torch.arange(1, 5, dtype=torch.float32)
        return _rope(x, torch.polar(torch.ones_like(angles), angles) * 0.5)


class BufferRope(torch.nn.Module):  # Meta's reference Llama: a complex buffer sliced by seq, [b, s, h, d]
    def __init__(self, persistent):
        super().__init__()
        t = torch.outer(torch.arange(16.0), torch.arange(1, 5, dtype=torch.float32) / 4)
        self.register_buffer("freqs_cis", torch.polar(torch.ones_like(t), t), persistent=persistent)

    def forward(self, x):
        return _rope(x, self.freqs_cis[: x.shape[1]].view(1, x.shape[1], 1, -1))


class Arithmetic(torch.nn.Module):  # conj, div, add/sub with scalars and real tensors, layout ops, reductions
    def forward(self, x, y):
        a = torch.view_as_complex(x.reshape(*x.shape[:-1], -1, 2))
        b = torch.complex(y[..., 0::2] + 2.0, y[..., 1::2])
        c = (a * b.conj()) / b - (1 + 2j) * a + y[..., 0::2] - 0.5
        c = torch.cat([c.permute(0, 2, 1), c.transpose(1, 2).unsqueeze(-1).squeeze(-1)], dim=-1)
        d = c.sum(dim=-2, keepdim=True) + c[:, 1:, :].mean(dim=1, keepdim=True)
        return c.real, c.imag, d.abs(), d.angle(), torch.view_as_real(torch.exp(0.1 * c.flip(-1)))


CASES = {
    "polar": (PolarRope(), (torch.randn(2, 3, 5, 8), torch.arange(5.0).repeat(2, 1))),
    "buffer": (BufferRope(persistent=True), (torch.randn(2, 5, 3, 8),)),
    "non-persistent buffer": (BufferRope(persistent=False), (torch.randn(2, 5, 3, 8),)),
    "arithmetic": (Arithmetic(), (torch.randn(2, 3, 8), torch.randn(2, 3, 8))),
}


@pytest.mark.parametrize("name", list(CASES))
def test_rewritten_program_is_real_and_matches_eager(name):
    model, args = CASES[name]
    program = torch.export.export(model, args)
    assert any(involves_complex(n) for n in program.graph.nodes)
    assert complex_to_real_pairs(program.graph_module, program) > 0
    assert not any(involves_complex(n) for n in program.graph.nodes)
    assert not any(t.is_complex() for t in (*program.state_dict.values(), *program.constants.values())
                   if isinstance(t, torch.Tensor))
    expected, actual = model(*args), program.module()(*args)
    for e, a in zip(*(v if isinstance(v, tuple) else (v,) for v in (expected, actual)), strict=True):
        torch.testing.assert_close(a, e, atol=1e-5, rtol=1e-5)
    if name.endswith("buffer"):
        assert model.freqs_cis.is_complex()  # the program's copy was converted, not the model's buffer


class ComplexOut(torch.nn.Module):
    def forward(self, x):
        return torch.view_as_complex(x) * 2


class ComplexIn(torch.nn.Module):
    def forward(self, z):
        return torch.view_as_real(z * 2)


class ComplexSort(torch.nn.Module):
    def forward(self, x):
        return torch.view_as_real(torch.view_as_complex(x).cumsum(0))


@pytest.mark.parametrize("model,arg,message", [
    (ComplexOut(), torch.randn(3, 2), "the program returns a complex tensor"),
    (ComplexIn(), torch.randn(3, dtype=torch.complex64), "graph input 'z' is a complex tensor"),
    (ComplexSort(), torch.randn(3, 2), "aten.cumsum.default on complex tensors .* has no real-pair rewrite"),
])
def test_what_cannot_be_rewritten_fails_with_a_clear_error(model, arg, message):
    program = torch.export.export(model, (arg,))
    with pytest.raises(ComplexRewriteError, match=message + ".*the onnx backend has no complex dtype"):
        complex_to_real_pairs(program.graph_module, program, backend="onnx")
