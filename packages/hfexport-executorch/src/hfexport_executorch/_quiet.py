"""Third-party console output a user can do nothing about, kept out of an export's output.

Two sources, both from importing or starting ExecuTorch, neither of which says anything about the user's model:

- torchao (imported by executorch) registers its Enum classes as pytree constants, and torch logs one
  deprecation warning per class (``<enum 'KernelPreference'> is an Enum subclass and is now natively
  supported ...``). Only records about torchao's own classes are dropped.
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
from collections.abc import Iterator

__all__ = ["quiet_torchao_pytree_warnings", "without_cpuinfo_lines"]

_NOISE = "cpuinfo_utils.cpp"


class _TorchaoEnumConstants(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args if isinstance(record.args, tuple) else ()
        module = getattr(args[0], "__module__", "") if args else ""
        return not (module.startswith("torchao") and "is an Enum subclass" in str(record.msg))


def quiet_torchao_pytree_warnings() -> None:
    """Drop torch's pytree deprecation warnings about torchao's Enum classes (idempotent)."""
    logger = logging.getLogger("torch.utils._pytree")
    if not any(isinstance(f, _TorchaoEnumConstants) for f in logger.filters):
        logger.addFilter(_TorchaoEnumConstants())


@contextlib.contextmanager
def without_cpuinfo_lines() -> Iterator[None]:
    """Run the body with file descriptor 2 captured; then pass on every line that is not the threadpool's
    ``cpuinfo_utils.cpp`` report (also when the body raises)."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as captured:
        os.dup2(captured.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            captured.seek(0)
            kept = [line for line in captured.read().decode(errors="replace").splitlines(keepends=True)
                    if _NOISE not in line]
            if kept:
                sys.stderr.write("".join(kept))
                sys.stderr.flush()
