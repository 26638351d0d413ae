"""CoreAtenExporter: the dynamo capture plus a Core ATen decomposition, as a vendor backend would add.

Built on the public plugin API only (``hfexport.plugin``, ``hfexport_dynamo``): the kernel captures the model with
its tracer, then calls ``lower``; it does not subclass the dynamo exporter.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

import torch

from hfexport.plugin import Component, ExportContext, ExportedModel, Exporter, Stage, Step, component_manifest
from hfexport_dynamo import DYNAMO_TRACER, DynamoConfig, DynamoRunner, load_program


class CoreAtenExporter(Exporter):
    name: ClassVar[str] = "testplugin"
    config_class = DynamoConfig
    tracer = DYNAMO_TRACER
    stages: ClassVar[tuple[Stage, ...]] = (Stage(1, "Core ATen decomposition", "internal"),)
    steps: ClassVar[tuple[Step, ...]] = (Step(0, "capture", "the dynamo stages, torch.export.export"),
                                         Step(1, "decompose", "run_decompositions"))

    def lower(self, ctx: ExportContext) -> None:
        with ctx.stage(1), ctx.step("run_decompositions"):
            ctx.program = ctx.program.run_decompositions()

    def package(self, ctx: ExportContext) -> ExportedModel:
        program = ctx.program
        write = lambda d: (torch.export.save(program, d / "model.pt2"), ["model.pt2"])[1]  # noqa: E731
        return self.artifact(ctx, [Component("model", DynamoRunner(program), program.call_spec.out_spec, write,
                                             {"program_file": "model.pt2"})])

    @classmethod
    def load_runner(cls, path: Path, manifest: dict[str, Any], component: str = "model", *,
                    trust_remote_code: bool = False) -> DynamoRunner:
        # load_program, not torch.export.load: a .pt2 is untrusted input (pickles, eval-ed expressions)
        return DynamoRunner(load_program(path / component_manifest(manifest, component)["program_file"],
                                         trust_remote_code=trust_remote_code))
