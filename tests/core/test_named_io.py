"""``hfexport.plugin.NamedIORunner``: the names of a traced program's leaves (``io_names``), and the runner's side
(names bound and checked, the named feed, the flat outputs with constants and ints put back), on a fake runtime."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from hfexport.plugin import NamedIORunner


class _Pairs(torch.nn.Module):
    def forward(self, x, y):
        return x + 1, {"sum": x + y, "size": x.shape[0]}, None


def test_io_names_names_every_leaf_and_keeps_ints_and_constants():
    x, y = torch.randn(3, 2), torch.randn(3, 2)
    program = torch.export.export(_Pairs(), (), {"x": x, "y": y},
                                  dynamic_shapes={"x": {0: torch.export.Dim("n")}, "y": {0: torch.export.Dim("n")}})
    io = NamedIORunner.io_names(program, {"x": x, "y": y})
    assert io == {"input_leaves": ["x", "y"], "output_leaves": ["output_0", "1.sum", "1.size", None],
                  "output_constants": {"3": None}, "int_outputs": [2]}


class _FakeRuntime(NamedIORunner):
    """A runtime whose inputs are ``a`` and ``b`` and whose output ``out`` is ``a + b`` (numpy, as OpenVINO's)."""

    io_error = LookupError

    def __init__(self, path, data_path=None, *, io=None):
        super().__init__(path, data_path, io=io)
        self.bind_io(["a", "b"], ["out"], accepted={"a", "b", "b_alias"})

    def run(self, args):
        feed = {name: t.numpy() for name, t in self.named_inputs(args).items()}
        return self.flat_outputs({"out": feed["a"] + feed["b_alias" if "b_alias" in feed else "b"],
                                  "n": np.array(len(feed["a"]))})


def test_a_runner_binds_checks_feeds_and_assembles(tmp_path: Path):
    path = tmp_path / "model.bin"
    path.write_bytes(b"")
    default = _FakeRuntime(path)
    assert (default.input_leaves, default.output_leaves) == (["a", "b"], ["out"])
    runner = _FakeRuntime(path, io={"input_leaves": ["a", None, "b_alias"], "output_leaves": ["out", "n", None],
                                    "output_constants": {"2": 7}, "int_outputs": [1]})
    out, n, constant = runner.run(({"p": torch.ones(2), "q": 3}, torch.ones(2, requires_grad=True)))
    assert isinstance(out, torch.Tensor) and out.tolist() == [2.0, 2.0]
    assert (n, type(n), constant) == (2, int, 7)
    with pytest.raises(TypeError, match="expected 3 input tensors after flattening, got 2"):
        runner.run((torch.ones(2), torch.ones(2)))
    with pytest.raises(LookupError, match=r"model.bin has no inputs \['c'\]; its inputs are \['a', 'b'\]"):
        _FakeRuntime(path, io={"input_leaves": ["a", "c"]})
