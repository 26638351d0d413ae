"""ExecuTorch's stage 2, Torch patches: ``@register_patch("executorch", ...)`` for torch ops whose traced form the
ExecuTorch backends cannot run; installed while tracing and lowering.

Each is an upstream bug or gap worked around until the fix named in its **Remove when**; ``disable=("<name>",)``
leaves one out (``tests/executorch/test_executorch_workarounds.py`` shows what each fixes).
"""

from __future__ import annotations

import functools
import sys
import threading
from typing import Any

import torch

from hfexport.plugin import register_patch

from .._decompositions import nonzero_row_major

__all__: list[str] = []


@register_patch("executorch", "torch.nonzero", "torch.Tensor.nonzero", "torch.argwhere", "torch.Tensor.argwhere",
                "torch.where")
def _patch_nonzero(original: Any) -> Any:
    """Traces ``nonzero`` (``argwhere``, one-argument ``torch.where``) as a boolean index of ``arange``, row-major.

    **Why**: torch's fake ``nonzero`` is column-major, so ExecuTorch plans its output in dim order ``(1, 0)`` while
    the portable kernel writes it row-major; the next kernel fails: ``2 input tensors have different dim orders``
    (s10).
    **Upstream**: pytorch/executorch#11086 (a layout an op's metadata declares and its kernel does not produce).
    **Remove when**: ExecuTorch plans ``nonzero``'s output in the default dim order (s10 runs with it disabled).
    """

    inside = threading.local()  # our own arange[mask] must not come back here
    is_where = getattr(original, "__name__", "") == "where"  # torch.where(cond): nonzero(cond, as_tuple=True)

    @functools.wraps(original)
    def nonzero(input: Any, *args: Any, **kwargs: Any) -> Any:
        if is_where and (args or kwargs):
            return original(input, *args, **kwargs)
        as_tuple = kwargs.pop("as_tuple", False) or is_where
        # torch's own callers (the meta kernel of boolean indexing) keep the original: only the model's calls change
        caller = sys._getframe(1).f_globals.get("__name__", "")
        if (args or kwargs or not isinstance(input, torch.Tensor) or input.dim() == 0
                or getattr(inside, "active", False) or caller == "torch" or caller.startswith("torch.")):
            if as_tuple and not is_where:
                kwargs["as_tuple"] = as_tuple
            return original(input, *args, **kwargs)
        inside.active = True
        try:
            result = nonzero_row_major(input)
        finally:
            inside.active = False
        return result.unbind(1) if as_tuple else result

    return nonzero
