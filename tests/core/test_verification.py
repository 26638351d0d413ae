"""The verification report: NaN/Inf reported as such (never as a 0.0 difference), stored in the manifest with
the max abs and rel diffs, tolerances and input shapes, and saved in export.json."""

from __future__ import annotations

import json
import math

import pytest
import torch
import torch.utils._pytree as pytree

from hfexport._artifact import MANIFEST_NAME, Component, ExportedModel, compare_outputs


class _Runner:
    """Runs a function in place of a runtime (e.g. one whose program file has a flipped byte)."""

    def __init__(self, fn):
        self.fn = fn

    def run(self, args):
        return [self.fn(*args)]


def _artifact(runtime) -> ExportedModel:
    spec = pytree.tree_flatten(torch.zeros(1))[1]
    manifest = {"schema_version": 1, "backend": "fake", "inputs": [{"name": "x"}],
                "outputs": [{"name": "output"}]}

    def write(directory):
        (directory / "model.bin").write_bytes(b"program")
        return ["model.bin"]

    return ExportedModel("fake", [Component("model", _Runner(runtime), spec, write)], manifest,
                         reference=lambda x: x * 2)


def test_nan_in_the_export_fails_and_is_reported_as_nan_not_zero(tmp_path):
    def runtime(x):
        out = x * 2
        out[0, 1] = float("nan")
        return out

    exported = _artifact(runtime)
    x = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    report = exported.verify({"x": x}, atol=1e-5, rtol=1e-5)
    assert not report.passed
    output = report["output"]
    assert math.isnan(output.max_abs_diff) and math.isnan(output.max_rel_diff), output
    assert "1 NaN in the export where eager has none" in output.note
    assert "max abs diff nan" in str(report) and "0.000e+00" not in str(report)
    assert math.isnan(report.max_abs_diff)

    stored = exported.manifest["verification"]
    assert stored["passed"] is False and stored["max_abs_diff"] == "nan"
    assert stored["inputs"] == {"x": [2, 3]} and stored["atol"] == 1e-5 and stored["rtol"] == 1e-5
    assert stored["outputs"][0]["max_abs_diff"] == "nan" and stored["outputs"][0]["ok"] is False

    saved = exported.save_pretrained(tmp_path / "out")  # a save after verify keeps the report
    on_disk = json.loads((saved / MANIFEST_NAME).read_text())  # strict JSON: no bare NaN
    assert on_disk["verification"] == stored


def test_inf_where_eager_is_finite_fails_with_inf(tmp_path):
    exported = _artifact(lambda x: torch.where(x > 4, torch.inf, x * 2))
    report = exported.verify({"x": torch.arange(6, dtype=torch.float32)}, atol=1e-3, rtol=1e-3)
    assert not report.passed and report["output"].max_abs_diff == math.inf
    assert "1 Inf in the export where eager differs" in report["output"].note
    assert exported.manifest["verification"]["outputs"][0]["max_abs_diff"] == "inf"


def test_nan_and_inf_at_the_same_places_on_both_sides_are_equal():
    e = torch.tensor([1.0, float("nan"), float("inf"), -float("inf")])
    report = compare_outputs("fake", {"y": e}, {"y": e.clone()}, atol=0.0, rtol=0.0)
    assert report.passed and report["y"].max_abs_diff == 0.0 and report["y"].note == ""
    swapped = compare_outputs("fake", {"y": e}, {"y": torch.tensor([1.0, 2.0, float("inf"), -float("inf")])},
                              atol=1.0, rtol=1.0)
    assert not swapped.passed and math.isnan(swapped["y"].max_abs_diff)
    assert "NaN in eager where the export has none" in swapped["y"].note


def test_a_passing_report_has_abs_and_rel_diffs_and_the_tolerance():
    e = torch.tensor([[1.0, -2.0], [4.0, 0.0]])
    report = compare_outputs("fake", e, e + 1e-4, atol=1e-3, rtol=1e-3)
    o = report.outputs[0]
    assert report.passed and o.max_abs_diff == pytest.approx(1e-4, rel=1e-2)
    assert o.max_rel_diff == math.inf  # eager is 0 where the export is not
    assert o.tolerance == pytest.approx(1e-3 + 1e-3 * 4.0)
    d = report.as_dict()
    assert d["outputs"][0]["max_rel_diff"] == "inf" and d["passed"] is True
    json.dumps(d, allow_nan=False)
