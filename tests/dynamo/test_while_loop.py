"""The patch of ``hfexport_dynamo._while_loop``: the carried tensors of a ``while_loop`` are cloned, so that a tensor
both carried and read by the body decomposes (ONNX, OpenVINO, ExecuTorch run ``run_decompositions``); with
``while_loop_max_iterations`` each loop is traced as that many masked steps (no ``while_loop`` op left). Disabling
the patch brings the failure back."""

from __future__ import annotations

import pytest
import torch
from torch._higher_order_ops import while_loop

import hfexport


class _Residual(torch.nn.Module):
    """The body reads ``x``, which is also the initial carried ``h``."""

    def __init__(self):
        super().__init__()
        self.mix = torch.nn.Linear(4, 4)

    def forward(self, iters, x):
        def cond_fn(it, h):
            return it > 0

        def body_fn(it, h):
            return it - 1, torch.tanh(self.mix(h)) + x

        return while_loop(cond_fn, body_fn, (iters, x))[1]


def _program(exported):
    return exported.components["model"].runner.program


def _inputs(n: int) -> dict[str, torch.Tensor]:
    return {"iters": torch.tensor(n), "x": torch.randn(3, 4, generator=torch.Generator().manual_seed(n))}


def test_a_carried_tensor_read_by_the_body_decomposes_and_not_without_the_patch():
    torch.manual_seed(0)
    model = _Residual().eval()
    program = _program(hfexport.export(model, _inputs(3), backend="dynamo")).run_decompositions()
    with torch.no_grad():
        torch.testing.assert_close(program.module()(*_inputs(5).values()), model(**_inputs(5)), atol=1e-6, rtol=1e-5)
    unpatched = _program(hfexport.export(model, _inputs(3), backend="dynamo", disable=("_patch_while_loop_entry",)))
    with pytest.raises(RuntimeError, match="aliasing"):
        unpatched.run_decompositions()


def test_while_loop_max_iterations_traces_masked_steps():
    torch.manual_seed(0)
    model = _Residual().eval()
    exported = hfexport.export(model, _inputs(3), backend="dynamo", while_loop_max_iterations=6)
    ops = [str(n.target) for n in _program(exported).graph.nodes if n.op == "call_function"]
    assert "while_loop" not in ops, ops
    for n in (0, 3, 6):  # within the bound: the loop's own value (iterations past the condition change nothing)
        with torch.no_grad():
            torch.testing.assert_close(exported(**_inputs(n)), model(**_inputs(n)), atol=1e-6, rtol=1e-5)
    with pytest.raises(TypeError, match="while_loop_max_iterations must be a positive int"):
        hfexport.export(model, _inputs(3), backend="dynamo", while_loop_max_iterations=0)
