"""CoreAtenExporter: the dynamo pipeline plus a Core ATen decomposition, as a vendor backend would add."""

from __future__ import annotations

from typing import ClassVar

from hfexport import ExportContext, ExportedModel, Stage
from hfexport_dynamo.exporter_dynamo import PROGRAM_FILE, DynamoExporter, DynamoRunner


class CoreAtenExporter(DynamoExporter):
    name: ClassVar[str] = "testplugin"
    stages: ClassVar[tuple[Stage, ...]] = (
        Stage(1, "Trace", "the dynamo pipeline", "stage_trace"),
        Stage(2, "Core ATen decomposition", "internal", "stage_decompose", runs="run_decompositions"),
    )

    def stage_trace(self, ctx: ExportContext) -> None:
        self.trace(ctx)

    def stage_decompose(self, ctx: ExportContext) -> None:
        ctx.program = ctx.program.run_decompositions()

    def package(self, ctx: ExportContext) -> ExportedModel:
        exported = super().package(ctx)
        exported.runner = DynamoRunner(ctx.program)
        exported.manifest["program_file"] = PROGRAM_FILE
        return exported
