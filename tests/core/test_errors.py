"""ExportError carries where an export failed as data: the stage (a capture stage under another backend), the
toolchain step, and whether it looks like a bug of hfexport rather than a problem with the model."""

import pytest
import torch

import hfexport
from hfexport import ExportError


class Exploding(torch.nn.Module):
    def forward(self, x):
        raise RuntimeError("exploded in forward")


def test_a_failure_in_the_capture_step_names_the_step_and_the_backend():
    with pytest.raises(ExportError) as info:
        hfexport.export(Exploding(), {"x": torch.ones(2, 3)}, backend="testplugin")
    err = info.value
    assert err.path == [] and err.step == "torch.export.export" and not err.internal
    assert (err.backend, err.stage_number, err.stage_title) == ("testplugin", 0, "")
    assert str(err).startswith("testplugin export: step torch.export.export failed for Exploding: RuntimeError: "
                               "exploded")
    assert "exploded in forward" in str(err.__cause__)


def test_a_failure_in_a_capture_stage_names_the_dynamo_stage_under_the_backend():
    with pytest.raises(ExportError) as info:
        hfexport.export(torch.nn.Linear(3, 2), {"input": torch.ones(2, 3)}, backend="testplugin",
                        dynamic_shapes={"x": {0: None}})
    err = info.value
    assert [(p.backend, p.number, p.total, p.title) for p in err.path] == [("dynamo", 4, 5, "Dynamic shapes")]
    assert str(err).startswith("testplugin export: dynamo stage 4/5 (Dynamic shapes) failed for Linear: KeyError")


def test_a_bug_in_a_stage_is_told_apart_from_a_model_problem(monkeypatch):
    import hfexport_dynamo.capture as capture

    def broken_stage(ctx):
        return ctx.no_such_attribute  # a bug of ours, not of the model

    monkeypatch.setattr(capture, "dynamic_shapes", broken_stage)
    with pytest.raises(ExportError) as info:
        hfexport.export(torch.nn.Linear(3, 2), {"input": torch.ones(2, 3)})
    err = info.value
    assert err.internal and err.step == "" and err.stage_number == 4
    assert "bug in hfexport" in str(err)


def test_a_wrong_input_is_the_users_problem_and_names_the_stage():
    with pytest.raises(ExportError) as info:
        hfexport.export(torch.nn.Linear(3, 2), {"input": torch.ones(2, 3)}, dynamic_shapes={"x": {0: None}})
    err = info.value
    assert not err.internal and err.stage_number == 4 and "not inputs" in str(err)
