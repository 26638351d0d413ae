"""ExecuTorch has no ``while_loop``: an export that holds one is refused before lowering, with an error that names the
op, ExecuTorch's upstream issue and the option (``while_loop_max_iterations``) that traces it as masked steps."""

from __future__ import annotations

import pytest
import torch

import hfexport
from helpers import WhileLoopRefine as _Refine


def test_while_loop_is_refused_naming_the_issue_and_the_option():
    torch.manual_seed(0)
    inputs = {"iters": torch.tensor(3), "x": torch.randn(2, 4)}
    with pytest.raises(hfexport.ExportError, match=r"torch\.ops\.higher_order\.while_loop.*pytorch/executorch#8769"
                                                   r".*while_loop_max_iterations=N"):
        hfexport.export(_Refine().eval(), inputs, backend="executorch-xnnpack")
