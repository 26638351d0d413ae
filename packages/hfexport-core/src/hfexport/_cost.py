"""What an export will cost, said and checked before it starts (issue 44): the model's weight bytes, the estimated
peak memory (the backend's measured ratio of peak RSS to weight bytes, declared as data on its exporter class:
``Exporter.export_peak_ratio``), the artifact's bytes on disk, and what this machine has.

:func:`estimate_export_cost` and :func:`refusal` are pure (figures in, figures or a message out);
:func:`check_export_cost` is what ``hfexport.export`` runs once, before any trace. ``HFEXPORT_AVAILABLE_MEMORY``
(bytes, or with a unit: ``512MB``, ``24GB``) replaces the memory read from the machine.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["AVAILABLE_MEMORY_ENV", "ExportCost", "InsufficientResourcesError", "check_export_cost",
           "estimate_export_cost", "export_cost", "refusal", "weight_bytes"]

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
            memory (``MemAvailable``, or a cgroup's limit when lower), or ``HFEXPORT_AVAILABLE_MEMORY``.
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


def _available_memory() -> int | None:
    """This process's resident bytes plus what the machine can still give it: ``MemAvailable``, or the cgroup's
    ``memory.max - memory.current`` where that is lower; None where /proc cannot be read."""
    from pathlib import Path

    try:
        fields = dict(line.split(":", 1) for path in ("/proc/meminfo", "/proc/self/status")
                      for line in Path(path).read_text().splitlines() if ":" in line)
        free = [int(fields["MemAvailable"].split()[0]) * 1024]
        own = int(fields["VmRSS"].split()[0]) * 1024
    except (OSError, KeyError, ValueError):
        return None
    cgroup = [Path(f"/sys/fs/cgroup/memory.{name}") for name in ("max", "current")]
    if all(p.is_file() for p in cgroup) and cgroup[0].read_text().strip().isdigit():
        free.append(int(cgroup[0].read_text()) - int(cgroup[1].read_text()))
    return min(free) + own


def estimate_export_cost(weight_bytes: int, peak_ratio: float | None, artifact_ratio: float = 1.0, *,
                         directory: str | os.PathLike[str] | None = None, available_memory: int | None = None,
                         free_disk: int | None = None, basis: str = "") -> ExportCost:
    """The cost of exporting ``weight_bytes`` of weights: peak ``weight_bytes * peak_ratio``, artifact
    ``weight_bytes * artifact_ratio``. ``available_memory`` and ``free_disk`` are read from this machine where
    None (``HFEXPORT_AVAILABLE_MEMORY``, else :func:`_available_memory`; ``shutil.disk_usage`` at the nearest
    existing directory above ``directory``, default the temporary directory an in-memory export writes to)."""
    directory = str(directory or tempfile.gettempdir())
    if available_memory is None:
        given = os.environ.get(AVAILABLE_MEMORY_ENV)
        available_memory = _parse_bytes(given) if given else _available_memory()
    if free_disk is None:
        existing = os.path.abspath(directory)
        while not os.path.isdir(existing) and os.path.dirname(existing) != existing:
            existing = os.path.dirname(existing)
        free_disk = shutil.disk_usage(existing).free
    peak = None if peak_ratio is None else int(weight_bytes * peak_ratio)
    return ExportCost(weight_bytes, peak_ratio, peak, int(weight_bytes * artifact_ratio), available_memory,
                      free_disk, directory, basis)


def refusal(cost: ExportCost, options: Mapping[str, int] | None = None) -> str | None:
    """Why ``cost`` does not fit (its peak above the available memory, its artifact above the free disk), naming the
    figures and what would fit: the entries of ``options`` (``{"quantize='int4'": its estimated peak bytes}``) whose
    peak fits, else a machine with that much memory; None when it fits or a figure is unknown."""
    problems = []
    if cost.peak_bytes is not None and cost.available_memory is not None and cost.peak_bytes > cost.available_memory:
        fits = [f"{name} (estimated peak {_size(peak)})" for name, peak in (options or {}).items()
                if peak <= cost.available_memory]
        problems.append(f"its estimated peak memory is {_size(cost.peak_bytes, 2)} ({cost.peak_ratio:g}x its "
                        f"{_size(cost.weight_bytes, 2)} of weights, {cost.basis}) and "
                        f"{_size(cost.available_memory, 2)} of memory are available to it; what would fit: "
                        f"{' or '.join(fits) or f'a machine with {_size(cost.peak_bytes)} of memory available'}")
    if cost.free_disk is not None and cost.disk_bytes > cost.free_disk:
        problems.append(f"its artifact needs about {_size(cost.disk_bytes, 2)} of disk and {cost.directory} has "
                        f"{_size(cost.free_disk, 2)} free: free some, or point TMPDIR or the output elsewhere")
    return "; ".join(problems) or None


def weight_bytes(model: Any) -> int:
    """The bytes of ``model``'s parameters and buffers, each storage once (tied weights, views: once); a model on
    the meta device counts the bytes it would hold."""
    import itertools

    sizes: dict[Any, int] = {}
    for tensor in itertools.chain(model.parameters(), model.buffers()):
        try:
            storage = tensor.untyped_storage()
            key, size = ((tensor.device, storage.data_ptr()) if storage.data_ptr() else id(tensor)), storage.nbytes()
        except (RuntimeError, NotImplementedError, TypeError):  # a tensor subclass without one storage
            key, size = id(tensor), tensor.nbytes
        sizes[key] = max(sizes.get(key, 0), size)
    return sum(sizes.values())


def _recipe(quantize: Any) -> str | None:
    return getattr(quantize, "recipe", quantize)


def export_cost(exporter: Any, model: Any, directory: str | os.PathLike[str] | None = None) -> ExportCost:
    """The cost of exporting ``model`` with ``exporter``, from the ratios its class declares for its config's
    ``quantize`` recipe (a recipe it has no figure for: its highest figure)."""
    ratios, recipe = exporter.export_peak_ratio, _recipe(getattr(exporter.config, "quantize", None))
    ratio = ratios.get(recipe, max(ratios.values(), default=None))
    measured = "measured" if recipe in ratios else f"{recipe} not measured: the highest figure"
    basis = f"{measured} for {exporter.name} {recipe or 'fp32'}" if ratios else f"not measured for {exporter.name}"
    return estimate_export_cost(weight_bytes(model), ratio, exporter.artifact_ratio.get(recipe, 1.0),
                                directory=directory, basis=basis)


def check_export_cost(exporter: Any, model: Any, directory: str | os.PathLike[str] | None = None) -> ExportCost:
    """:func:`export_cost`, refused with :class:`InsufficientResourcesError` when it does not fit this machine."""
    cost = export_cost(exporter, model, directory)
    other = {f"quantize={name!r}": int(cost.weight_bytes * ratio) for name, ratio in exporter.export_peak_ratio.items()
             if name is not None and name != _recipe(getattr(exporter.config, "quantize", None))}
    why = refusal(cost, other)
    if why:
        raise InsufficientResourcesError(f"{exporter.name} export of {type(model).__name__} refused before it starts: "
                                         f"{why}; or export anyway with check_resources=False (CLI "
                                         "--no-resource-check)", cost)
    return cost
