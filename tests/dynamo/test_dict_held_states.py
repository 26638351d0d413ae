"""Tensors that a cache holds in a dict (transformers' ``LinearAttentionLayer.conv_states``, ``{state_idx: tensor}``:
LFM2, Qwen3-Next, the Mamba2 hybrids; f11's kind) and that forward mutates in place are inputs of the program on
every backend, and their new value is written back into the caller's tensors as eager ``forward`` does.

Before ``hfexport_dynamo._pytree._is_child`` took dicts, the dict went into the pytree context: dynamo's own
verification raised ``Boolean value of Tensor with more than one value is ambiguous`` (comparing contexts) and the
other backends ``Constant ...lifted_tensor_0 is mutated in the forward method``. ExecuTorch returns the new value
of a mutated input as a leading output (``treespec.unflatten: leaves has length 2 ... holds 1``) and OpenVINO's
lowering refused input mutation: both runners now copy it back into the input."""

import pytest
import torch

import hfexport
from hfexport_dynamo._pytree import register_cache_type


class ConvState:
    """A cache layer in the shape of ``LinearAttentionLayer``: a dict of states by index, a dict of flags."""

    def __init__(self, state: torch.Tensor):
        self.conv_states = {0: state, 1: None}
        self.has_previous_state = {0: True, 1: False}
        self.kernel = 3


register_cache_type(ConvState)


class RollingConv(torch.nn.Module):
    """One decode step of a short causal convolution over a rolling state (LFM2's ``causal_conv1d_update``)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.weight = torch.nn.Parameter(torch.randn(4, 3))

    def forward(self, x, cache):
        state = cache.conv_states[0]
        full = torch.cat([state, x], dim=-1)  # [1, 4, 3 + 1]
        state.copy_(full[:, :, -3:])  # in place, as transformers keeps the state's address
        return (full[:, :, -3:] * self.weight).sum(-1)


def inputs():
    return {"x": torch.tensor([[[1.0], [2.0], [-1.0], [0.5]]]),
            "cache": ConvState(torch.arange(12.0).reshape(1, 4, 3) / 7)}


@pytest.mark.parametrize("backend", ["dynamo", "onnx", "executorch-xnnpack", "openvino"])
def test_dict_held_state_mutated_in_place(backend):
    model = RollingConv().eval()
    eager_inputs = inputs()
    with torch.no_grad():
        expected = model(**eager_inputs)
    exported = hfexport.export(model, inputs(), backend=backend)
    call = inputs()
    torch.testing.assert_close(exported(**call), expected, atol=1e-5, rtol=1e-5)
    if backend != "onnx":  # torch.onnx keeps user outputs only: the new value of a mutated input is dropped
        assert not torch.equal(eager_inputs["cache"].conv_states[0], inputs()["cache"].conv_states[0])
        torch.testing.assert_close(call["cache"].conv_states[0], eager_inputs["cache"].conv_states[0])


def test_the_dict_is_a_pytree_child_not_context():
    leaves, spec = torch.utils._pytree.tree_flatten(inputs()["cache"])
    assert len(leaves) == 1 and leaves[0].shape == (1, 4, 3)
    assert "tensor" not in repr(spec.context)  # only the flags and the kernel size stay in the context
    rebuilt = torch.utils._pytree.tree_unflatten(leaves, spec)
    assert rebuilt.conv_states[0] is leaves[0] and rebuilt.conv_states[1] is None and rebuilt.kernel == 3
