"""What an export will cost, said and checked before it starts (issue 44): the model's weight bytes, the estimated
peak memory (the backend's measured ratio of peak RSS to weight bytes, declared as data on its exporter class:
``Exporter.export_peak_ratio``), the artifact's bytes on disk, and what this machine has.

:func:`estimate_export_cost` and :func:`refusal` are pure (figures in, figures or a message out);
:func:`check_export_cost` is what ``hfexport.export`` runs once, before any trace (and the CLI, to print its line).

The memory available to an export is this process's resident memory (the model it holds is part of the measured
peak) plus the machine's ``MemAvailable``; ``HFEXPORT_AVAILABLE_MEMORY`` (bytes, or with a unit: ``512MB``,
``24GB``) replaces it (a container's limit, a test). The disk is that of the output directory (the CLI) or of the
temporary directory an in-memory export writes its files to (the API). A recipe the backend has no figure for gets
the backend's highest figure; a backend with none, no memory estimate (and no memory check).
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["AVAILABLE_MEMORY_ENV", "ExportCost", "InsufficientResourcesError", "check_export_cost",
           "estimate_export_cost", "refusal", "weight_bytes"]

AVAILABLE_MEMORY_ENV = "HFEXPORT_AVAILABLE_MEMORY"


def _size(n: float, digits: int = 1) -> str:
    return f"{n / 1e9:.{digits}f} GB" if n >= 1e9 else f"{n / 1e6:.{digits}f} MB"


class InsufficientResourcesError(MemoryError):
    """The export would not fit this machine: its estimated peak memory exceeds the memory available to it, or its
    artifact the free disk (the message names the figures, what would fit, and the override ``check_resources=False``,
    CLI ``--no-resource-check``). ``cost`` is the :class:`ExportCost`."""

    def __init__(self, message: str, cost: ExportCost):
        super().__init__(message)
        self.cost = cost


@dataclass(frozen=True)
class ExportCost:
    """One export's estimated cost and this machine's resources, in bytes (None: unknown).

    Attributes:
        weight_bytes: the model's parameters and buffers, each storage counted once (tied weights once).
        peak_ratio: the backend's measured peak RSS over weight bytes (None: not measured for this backend).
        peak_bytes: the estimated peak resident memory of the export (``weight_bytes * peak_ratio``).
        disk_bytes: the artifact's estimated bytes on disk.
        available_memory: what the export may reach: this process's resident memory and the machine's available
            memory (``MemAvailable``; a container's cgroup limit is not read: set ``HFEXPORT_AVAILABLE_MEMORY``
            there), or ``HFEXPORT_AVAILABLE_MEMORY``.
        free_disk: free bytes at ``directory``.
        basis: where ``peak_ratio`` comes from (``"measured for onnx fp32"``).
    """

    weight_bytes: int
    peak_ratio: float | None
    peak_bytes: int | None
    disk_bytes: int
    available_memory: int | None
    free_disk: int | None
    directory: str
    basis: str = ""

    def line(self) -> str:
        """One line: ``weights 1.98 GB; estimated peak 7.1 GB (3.6x, measured for onnx fp32); artifact ~2.0 GB; this
        machine: 21.3 GB memory available, 73 GB disk free at out/onnx``."""
        peak = (f"estimated peak {_size(self.peak_bytes)} ({self.peak_ratio:g}x, {self.basis})"
                if self.peak_bytes is not None else f"no estimate of the peak ({self.basis})")
        memory = "unknown" if self.available_memory is None else _size(self.available_memory)
        disk = "unknown" if self.free_disk is None else _size(self.free_disk)
        return (f"weights {_size(self.weight_bytes, 2)}; {peak}; artifact ~{_size(self.disk_bytes)}; this "
                f"machine: {memory} memory available, {disk} disk free at {self.directory}")


def _parse_bytes(text: str) -> int:
    match = re.fullmatch(r"\s*([0-9.e+]+)\s*([kmgt]?)i?b?\s*", text.lower())
    if not match:
        raise ValueError(f"{AVAILABLE_MEMORY_ENV}={text!r}: give bytes, or a size such as 512MB or 24GB")
    return int(float(match[1]) * 1000 ** "_kmgt".index(match[2] or "_"))


def estimate_export_cost(weight_bytes: int, peak_ratio: float | None, artifact_ratio: float = 1.0, *,
                         directory: str | os.PathLike[str] | None = None, available_memory: int | None = None,
                         free_disk: int | None = None, basis: str = "") -> ExportCost:
    """Peak and artifact bytes from the ratios; where None, this machine's memory and free disk at ``directory``."""
    directory = str(directory or tempfile.gettempdir())
    if available_memory is None and os.environ.get(AVAILABLE_MEMORY_ENV):
        available_memory = _parse_bytes(os.environ[AVAILABLE_MEMORY_ENV])
    elif available_memory is None:  # this process's RSS (the model it holds is in the measured peak) + MemAvailable
        with contextlib.suppress(OSError, KeyError, ValueError):  # no /proc: unknown, not checked
            fields = dict(line.split(":", 1) for path in ("/proc/meminfo", "/proc/self/status")
                          for line in Path(path).read_text().splitlines() if ":" in line)
            available_memory = (int(fields["MemAvailable"].split()[0]) + int(fields["VmRSS"].split()[0])) * 1024
    free_disk = shutil.disk_usage(directory).free if free_disk is None else free_disk
    return ExportCost(weight_bytes, peak_ratio, None if peak_ratio is None else int(weight_bytes * peak_ratio),
                      int(weight_bytes * artifact_ratio), available_memory, free_disk, directory, basis)


def refusal(cost: ExportCost, options: Mapping[str, int] | None = None) -> str | None:
    """Why ``cost`` does not fit, with what would: the ``options`` (name: estimated peak bytes) that fit, else a
    machine with that memory; None when it fits (or a figure is unknown)."""
    problems = []
    if cost.peak_bytes is not None and cost.available_memory is not None and cost.peak_bytes > cost.available_memory:
        fits = [f"{name} (estimated peak {_size(peak)})" for name, peak in (options or {}).items()
                if peak <= cost.available_memory] or [f"a machine with {_size(cost.peak_bytes)} of memory available"]
        problems.append(f"its estimated peak memory is {_size(cost.peak_bytes, 2)} ({cost.peak_ratio:g}x its "
                        f"{_size(cost.weight_bytes, 2)} of weights, {cost.basis}) and {_size(cost.available_memory, 2)}"
                        f" of memory are available to it; what would fit: {' or '.join(fits)}")
    if cost.free_disk is not None and cost.disk_bytes > cost.free_disk:
        problems.append(f"its artifact needs about {_size(cost.disk_bytes, 2)} of disk and {cost.directory} has "
                        f"{_size(cost.free_disk, 2)} free: free some, or point TMPDIR or the output elsewhere")
    return "; ".join(problems) or None


def weight_bytes(model: Any) -> int:
    """``model``'s parameter and buffer bytes, each storage once (tied weights once; the meta device too)."""
    sizes: dict[Any, int] = {}
    for tensor in (*model.parameters(), *model.buffers()):
        try:  # a storage without an address (the meta device) is the tensor's own
            storage = tensor.untyped_storage()
            key, size = (tensor.device, storage.data_ptr()) if storage.data_ptr() else id(tensor), storage.nbytes()
        except (RuntimeError, NotImplementedError, TypeError):  # a tensor subclass without one storage
            key, size = id(tensor), tensor.nbytes
        sizes[key] = max(sizes.get(key, 0), size)
    return sum(sizes.values())


def check_export_cost(exporter: Any, model: Any, directory: str | os.PathLike[str] | None = None, *,
                      refuse: bool = True) -> ExportCost:
    """The cost of exporting ``model`` with ``exporter``; with ``refuse``, :class:`InsufficientResourcesError`."""
    quantize = getattr(exporter.config, "quantize", None)  # a recipe name or a Quantization
    recipe, ratios = getattr(quantize, "recipe", quantize), exporter.export_peak_ratio
    basis = (f"measured for {exporter.name} {recipe or 'fp32'}" if recipe in ratios else f"{exporter.name}'s highest "
             f"measured figure; {recipe} was not measured" if ratios else f"not measured for {exporter.name}")
    cost = estimate_export_cost(weight_bytes(model), ratios.get(recipe, max(ratios.values(), default=None)),
                                exporter.artifact_ratio.get(recipe, 1.0), directory=directory, basis=basis)
    memory, disk = cost.available_memory, cost.free_disk  # the message only when it does not fit
    if refuse and (memory is not None and (cost.peak_bytes or 0) > memory or disk is not None and cost.disk_bytes > disk):
        why = refusal(cost, {f"quantize={name!r}": int(cost.weight_bytes * ratio) for name, ratio in ratios.items()
                             if name not in (None, recipe)})
        raise InsufficientResourcesError(f"{exporter.name} export of {type(model).__name__} refused before it "
                                         f"starts: {why}; or export anyway with check_resources=False (CLI "
                                         "--no-resource-check)", cost)
    return cost
