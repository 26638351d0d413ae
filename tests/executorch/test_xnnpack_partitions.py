"""FX node fixes that keep XNNPACK's partitions whole (``_fix_last_dim_mean_as_average_pooling``,
``_fix_reshape_one_dynamic_dim_inferred`` and ``_fix_rotary_cat_as_linear`` in
``hfexport_executorch/workarounds/node_fixes.py``): each left out with ``disable=``, what it changes in the lowered
program, and the same outputs either way."""

from __future__ import annotations

import pytest
import torch
from torch.export import Dim

import hfexport

pytest.importorskip("executorch")

MEAN_FIX = "_fix_last_dim_mean_as_average_pooling"


class NormedLinear(torch.nn.Module):
    """Llama's RMSNorm (``x * rsqrt(mean(x^2, -1) + eps)``) between two linears: one XNNPACK partition when the mean
    is delegated, two around a portable ``mean`` when it is not."""

    def __init__(self, hidden=16):
        super().__init__()
        self.first, self.second = torch.nn.Linear(hidden, hidden), torch.nn.Linear(hidden, hidden)
        self.weight = torch.nn.Parameter(torch.rand(hidden) + 0.5)

    def forward(self, x):
        x = self.first(x)
        variance = x.pow(2).mean(-1, keepdim=True)
        return self.second(self.weight * (x * torch.rsqrt(variance + 1e-6)))


def lowered(model, x, dynamic_shapes, disable=()):
    exported = hfexport.export(model, {"x": x}, backend="executorch-xnnpack", dynamic_shapes=dynamic_shapes,
                               disable=disable)
    return exported, exported.manifest["executorch"]


@pytest.mark.parametrize("fixed", [True, False], ids=["fixed", "disabled"])
def test_a_norms_mean_stays_in_the_xnnpack_partition(fixed):
    torch.manual_seed(0)
    model = NormedLinear().eval()
    x = torch.randn(1, 7, 16)
    exported, lowering = lowered(model, x, {"x": {1: Dim("seq", min=1, max=64)}}, () if fixed else (MEAN_FIX,))
    assert lowering["delegates"] == (1 if fixed else 2), lowering
    assert ("aten::mean.dim" in lowering["portable_ops"]) is not fixed, lowering["portable_ops"]
    for seq in (7, 1, 33):  # the traced length, a decode step, another prefill length
        other = torch.randn(1, seq, 16)
        torch.testing.assert_close(exported(x=other), model(other), atol=1e-5, rtol=1e-5)


def test_a_mean_over_two_dynamic_sizes_is_left_to_the_portable_kernel():
    """XNNPACK's reshape takes one symbolic size: with a dynamic batch too, the mean stays as it was."""
    torch.manual_seed(0)
    model = NormedLinear().eval()
    x = torch.randn(2, 7, 16)
    exported, lowering = lowered(model, x, {"x": {0: Dim("batch", min=1, max=4), 1: Dim("seq", min=1, max=64)}})
    assert "aten::mean.dim" in lowering["portable_ops"], lowering
    other = torch.randn(3, 5, 16)
    torch.testing.assert_close(exported(x=other), model(other), atol=1e-5, rtol=1e-5)


RESHAPE_FIX, ROTARY_FIX = "_fix_reshape_one_dynamic_dim_inferred", "_fix_rotary_cat_as_linear"


def rotate_half(x):
    return torch.cat((-x[..., x.shape[-1] // 2:], x[..., : x.shape[-1] // 2]), dim=-1)


class RotaryProjection(torch.nn.Module):
    """A decoder layer's query path: projection, ``view(*shape, -1, head_dim)``, rotary embedding with the angles
    ``cat([freqs, freqs], -1)`` and ``cos.unsqueeze(1)`` (transformers' Llama), output projection. One XNNPACK
    partition with the fixes; the reshapes, the slices and the concatenations cut it without."""

    def __init__(self, hidden=32, head_dim=8):
        super().__init__()
        self.head_dim = head_dim
        self.q, self.o = torch.nn.Linear(hidden, hidden), torch.nn.Linear(hidden, hidden)
        self.register_buffer("inv_freq", 1.0 / (10000 ** (torch.arange(0, head_dim, 2).float() / head_dim)))

    def forward(self, x):
        batch, seq, _ = x.shape
        positions = torch.arange(seq, dtype=torch.float32).unsqueeze(0).unsqueeze(-1)  # [1, seq, 1]
        freqs = positions * self.inv_freq  # [1, seq, head_dim / 2]
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos().unsqueeze(1), emb.sin().unsqueeze(1)  # [1, 1, seq, head_dim]
        q = self.q(x).view(batch, seq, -1, self.head_dim).transpose(1, 2)  # [1, heads, seq, head_dim]
        q = q * cos + rotate_half(q) * sin
        return self.o(q.transpose(1, 2).reshape(batch, seq, -1))


@pytest.mark.parametrize("fixed", [True, False], ids=["fixed", "disabled"])
def test_rotary_embedding_and_head_reshapes_stay_in_one_xnnpack_partition(fixed):
    torch.manual_seed(0)
    model = RotaryProjection().eval()
    x = torch.randn(1, 7, 32)
    exported, lowering = lowered(model, x, {"x": {1: Dim("seq", min=1, max=64)}},
                                 () if fixed else (RESHAPE_FIX, ROTARY_FIX))
    if fixed:
        assert lowering["delegates"] == 1, lowering
        assert not {"aten::slice_copy.Tensor", "aten::cat.default"} & set(lowering["portable_ops"]), lowering
    else:
        assert lowering["delegates"] > 1, lowering
    for seq in (7, 1, 33):
        other = torch.randn(1, seq, 32)
        torch.testing.assert_close(exported(x=other), model(other), atol=1e-5, rtol=1e-5)


def test_the_rotary_linear_is_exact():
    """The signed permutation that replaces ``rotate_half`` and the angles' repeat changes no bit: each output is one
    input times +-1 plus zeros (XNNPACK's linear against eager's slices and concatenation, compared exactly)."""

    class Rotate(torch.nn.Module):
        def forward(self, x):
            return rotate_half(x * 1.5), torch.cat((x, x), dim=-1)

    x = torch.randn(1, 3, 9, 16) * 1e3
    exported, lowering = lowered(Rotate().eval(), x, {"x": {2: Dim("seq", min=1, max=64)}})
    assert "aten::cat.default" not in lowering["portable_ops"], lowering
    for seq in (9, 1, 40):
        other = torch.randn(1, 3, seq, 16) * 1e3
        for got, expected in zip(exported(x=other), Rotate()(other), strict=True):
            torch.testing.assert_close(got, expected, atol=0, rtol=0)


class EmbeddedRotary(torch.nn.Module):
    """Token embedding, then :class:`RotaryProjection`: quantized with a 4-bit embedding, the program's first
    placeholder is a torchao quantized weight, not a FakeTensor."""

    def __init__(self, vocab=64, hidden=32):
        super().__init__()
        self.embed, self.layer = torch.nn.Embedding(vocab, hidden), RotaryProjection(hidden)

    def forward(self, input_ids):
        return self.layer(self.embed(input_ids))


def test_the_rotary_fix_takes_a_program_whose_first_weight_is_quantized():
    """``quantize="8da4w"`` with ``embedding="4w"``: the rotary matrix is added as a parameter in the mode of the
    program's fake tensors (ExecuTorch's ``create_constant_placeholder`` took the first node's and failed: "no
    attribute 'fake_mode'", the CLI's ``--quantize 8da4w --qembedding 4w`` on a tiny Llama)."""
    torch.manual_seed(0)
    model = EmbeddedRotary().eval()
    exported = hfexport.export(model, {"input_ids": torch.randint(0, 64, (1, 7))}, backend="executorch-xnnpack",
                               dynamic_shapes={"input_ids": {1: Dim("seq", min=1, max=64)}},
                               quantize=hfexport.Quantization("8da4w", group_size=32, embedding="4w"))
    fixes = {name.rsplit(".", 1)[-1] for name in exported.manifest["workarounds"]["fixes"]}
    assert ROTARY_FIX in fixes, fixes
    assert exported.manifest["verification"]["passed"], exported.manifest["verification"]
    assert exported.manifest["components"]["model"]["quantization"]["quantized"]["embedding"] == 1
