"""DynamoExporter: ``torch.export`` of Transformers models (and any ``nn.Module``) to a ``.pt2`` program.

The ``.pt2`` is the captured program as it is: the exporter has no ``prepare`` and no ``lower``, and its stages are
capture's five (``hfexport_dynamo/capture.py``, marked there by their ``# ── Stage N: Title ──`` banners: Forward
signature patch, Model patches, Pytree registration, Dynamic shapes, State cleanup), then the step
``torch.export.export`` (``export_step.py``). Loading checks the file before torch reads it
(:func:`hfexport_dynamo.load_program`).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, ClassVar

import torch
import torch.utils._pytree as pytree

from hfexport.artifact import DEFAULT_COMPONENT
from hfexport.plugin import (
    Component,
    ExportConfig,
    ExportContext,
    ExportedModel,
    Exporter,
    Stage,
    Step,
    artifact_file,
    component_manifest,
)
from hfexport.trust import artifact_bytes

from ._config import DynamoConfig
from ._pt2 import load_program, mutated_buffer_names, own_mutated_buffers, runnable_module, save_program
from .capture import CAPTURE_STAGES
from .skips import EXPORT_SKIPS
from .tracer import DYNAMO_TRACER

__all__ = ["DynamoConfig", "DynamoExporter", "DynamoRunner", "PROGRAM_FILE"]

logger = logging.getLogger("hfexport")
PROGRAM_FILE = "model.pt2"

class DynamoRunner:
    """Runs an ``ExportedProgram`` (in memory or loaded from ``model.pt2``) with eager PyTorch kernels."""

    def __init__(self, program: torch.export.ExportedProgram):
        self.program = program
        self._module = runnable_module(program)  # buffers: copies, so the program keeps their initial value

    def run(self, args: tuple[Any, ...]) -> list[Any]:
        with torch.no_grad():
            return pytree.tree_leaves(self._module(*args))

    def reset(self) -> None:
        """Return the buffers the program mutates to their initial value (a fresh copy of them)."""
        if mutated_buffer_names(self.program):
            self._module = runnable_module(self.program)


class DynamoExporter(Exporter):
    """Export to a ``torch.export`` program (``model.pt2``), runnable with ``torch.export.load``: the captured
    program as it is (no ``prepare``, no ``lower``)."""

    name: ClassVar[str] = "dynamo"
    config_class: ClassVar[type[ExportConfig]] = DynamoConfig
    scopes: ClassVar[tuple[str, ...]] = ("dynamo",)
    # Peak RSS / weight bytes of a text-generation export of the seeded 0.5 B Qwen2 (1,976 MB of fp32 weights,
    # from_pretrained, export, save_pretrained): 3,429 MiB = 1.82x, artifact 2,081 MB (benchmarks/results/
    # bench_generation_0.5b.txt, run 9, 2026-12-07; 4,241 MiB = 2.25x in run 8, before the save wrote each weight
    # from its storage).
    export_peak_ratio: ClassVar[dict[str | None, float]] = {None: 1.9}
    artifact_ratio: ClassVar[dict[str | None, float]] = {None: 1.05}
    tracer = DYNAMO_TRACER
    checked_on_read: ClassVar[tuple[str, ...]] = ("program_file",)  # load_runner: artifact_bytes
    toolchain: ClassVar[tuple[str, ...]] = DYNAMO_TRACER.toolchain
    tested_versions: ClassVar[dict[str, str]] = DYNAMO_TRACER.tested_versions
    stages: ClassVar[tuple[Stage, ...]] = CAPTURE_STAGES
    steps: ClassVar[tuple[Step, ...]] = (Step(5, "capture", "torch.export.export"),)

    # ── packaging ─────────────────────────────────────────────────────────────────────────────────────
    def package(self, ctx: ExportContext) -> ExportedModel:
        program = own_mutated_buffers(ctx.program)  # not the model's tensors: later eager calls change nothing here

        def write(directory: Path) -> list[str]:
            save_program(program, directory / PROGRAM_FILE)  # a full disk is an OSError, not a SIGABRT
            return [PROGRAM_FILE]

        return self.artifact(ctx, [Component(DEFAULT_COMPONENT, DynamoRunner(program), program.call_spec.out_spec,
                                             write, {"program_file": PROGRAM_FILE})])

    @classmethod
    def load_runner(cls, path: Path, manifest: dict[str, Any], component: str = DEFAULT_COMPONENT, *,
                    trust_remote_code: bool = False) -> DynamoRunner:
        """Open a saved component's ``.pt2`` after checking that loading and running it executes nothing from
        the file (pickles beyond tensors, shape expressions and guards beyond sizes, non-operator targets; see
        :func:`hfexport_dynamo.load_program`), unless ``trust_remote_code``."""
        section = component_manifest(manifest, component)
        where = f"components[{component!r}].program_file"
        program = artifact_file(path, manifest, section.get("program_file"), where)
        # read once, checked, handed over: a bytearray, which the program's weights are built on (no second copy)
        data = artifact_bytes(path, manifest, section.get("program_file"), where, writable=True)
        return DynamoRunner(load_program(program, trust_remote_code=trust_remote_code, data=data))

    @classmethod
    def known_failures(cls) -> dict[str, dict[str, str]]:
        return {"EXPORT_SKIPS": dict(EXPORT_SKIPS)}

    def hints_for(self, stage: Stage, exc: BaseException) -> list[str]:
        text = str(exc)
        if "not a known type" in text or "register a pytree" in text.lower():
            return ["register the input/output type: hfexport_dynamo.register_cache_type(cls)"]
        return []
