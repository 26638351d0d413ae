"""Third-party console output a user can do nothing about, kept out of an export's output.

Two sources, both from importing or starting ExecuTorch, neither of which says anything about the user's model:

- torchao (imported by executorch) registers its Enum classes as pytree constants, and torch logs one
  deprecation warning per class (``<enum 'KernelPreference'> is an Enum subclass and is now natively
  supported ...``). Only records about torchao's own classes are dropped.
- ExecuTorch's LLM kernels (``llama::custom_sdpa``, used by generation programs) ask the runtime for a temporary
  allocator, which the Python runtime does not provide, log ``No temp allocator provided`` from C++ to file
  descriptor 2 at every call, and allocate for themselves. Dropped from every method call's output.
- ExecuTorch's threadpool logs what it reads from ``/sys`` when it starts (``[cpuinfo_utils.cpp:71] Reading
  file /sys/devices/soc0/image_version``, ``Failed to open midr file``), from C++ straight to file descriptor 2,
  at the first ``load_method`` of an XNNPACK program in a process. Every other line is passed on.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import tempfile
import warnings
from collections.abc import Iterator
from typing import Any

from hfexport.commands import verbose

__all__ = ["quiet_torchao_pytree_warnings", "without_cpuinfo_lines", "without_lowering_notices",
           "without_temp_allocator_lines"]

_NOISE = "cpuinfo_utils.cpp"


class _TorchaoEnumConstants(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args if isinstance(record.args, tuple) else ()
        module = getattr(args[0], "__module__", "") if args else ""
        return not (module.startswith("torchao") and "is an Enum subclass" in str(record.msg))


def quiet_torchao_pytree_warnings() -> None:
    """Drop torch's pytree deprecation warnings about torchao's Enum classes (idempotent; nothing under
    ``hfexport --verbose``)."""
    if verbose():
        return
    logger = logging.getLogger("torch.utils._pytree")
    if not any(isinstance(f, _TorchaoEnumConstants) for f in logger.filters):
        logger.addFilter(_TorchaoEnumConstants())


_TEMP_ALLOCATOR = "No temp allocator provided"
_captured: Any = None  # one file for every call's output (a new temporary file per call costs ~0.1 ms)


@contextlib.contextmanager
def _stderr_without(*noise: str) -> Iterator[None]:
    """Run the body with file descriptor 2 captured; then pass on every line that holds none of ``noise`` (also
    when the body raises); under ``hfexport --verbose`` every line passes. Not re-entrant: the capture file is
    shared."""
    global _captured
    if verbose():
        yield
        return
    if _captured is None:
        _captured = tempfile.TemporaryFile()
    sys.stderr.flush()
    saved = os.dup(2)
    _captured.seek(0)
    _captured.truncate()
    os.dup2(_captured.fileno(), 2)
    try:
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        _captured.seek(0)
        output = _captured.read()
        if output:
            kept = [line for line in output.decode(errors="replace").splitlines(keepends=True)
                    if not any(text in line for text in noise)]
            if kept:
                sys.stderr.write("".join(kept))
                sys.stderr.flush()


def without_cpuinfo_lines() -> contextlib.AbstractContextManager[None]:
    """Run the body with file descriptor 2 captured; then pass on every line that is not the threadpool's
    ``cpuinfo_utils.cpp`` report (also when the body raises)."""
    return _stderr_without(_NOISE)


def without_temp_allocator_lines() -> contextlib.AbstractContextManager[None]:
    """Run the body (a method call, or an eager call of the LLM kernels) with file descriptor 2 captured; then pass on
    every line but the kernels' ``No temp allocator provided`` and the threadpool's ``cpuinfo_utils.cpp`` report,
    which the eager kernels start too (also when the body raises)."""
    return _stderr_without(_TEMP_ALLOCATOR, _NOISE)


@contextlib.contextmanager
def without_lowering_notices() -> Iterator[None]:
    """Within the body (an export's stages), two Python warnings of the toolchain are not shown (unless
    ``hfexport --verbose``); every other warning is:

    - ``_check_is_size will be removed in a future PyTorch release`` (FutureWarning), from ExecuTorch's LLM custom
      ops (``executorch/extension/llm/custom_ops/custom_ops.py``), once per traced attention call: a deprecation
      inside ExecuTorch, eleven lines for a one-layer decoder;
    - ``Mutation on a buffer in the model is detected`` (UserWarning, ``exir/emit/_emitter.py``): a buffer's initial
      value is not serialized. hfexport stores the initial value of every buffer it is not zero for
      (``_patch_mutable_buffer_initial_state``, field case d12), so the warning is about nothing it leaves out.
    """
    if verbose():
        yield
        return
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"_check_is_size will be removed", category=FutureWarning)
        warnings.filterwarnings("ignore", message=r"Mutation on a buffer in the model is detected",
                                category=UserWarning)
        yield
