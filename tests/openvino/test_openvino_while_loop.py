"""OpenVINO's FX frontend converts a ``while_loop`` whose body calls a module once the loop's ``additional_inputs``
(the module's parameters) are carried instead (``_fix_while_loop_additional_carried``); without the fix the
conversion fails (``body_results.size() == num_carried``)."""

from __future__ import annotations

import pytest
import torch

import hfexport
from helpers import WhileLoopRefine as _Refine


def _inputs(n: int) -> dict[str, torch.Tensor]:
    return {"iters": torch.tensor(n), "x": torch.randn(2, 4, generator=torch.Generator().manual_seed(n))}


def test_while_loop_with_a_module_in_the_body_converts_and_not_without_the_fix():
    torch.manual_seed(0)
    model = _Refine().eval()
    exported = hfexport.export(model, _inputs(3), backend="openvino")
    for n in (3, 5):
        with torch.no_grad():
            torch.testing.assert_close(exported(**_inputs(n)), model(**_inputs(n)), atol=1e-5, rtol=1e-4)
    with pytest.raises(hfexport.ExportError, match="OpConversionFailure"):  # while_loop, getitem unconverted
        hfexport.export(model, _inputs(3), backend="openvino", disable=("_fix_while_loop_additional_carried",))
