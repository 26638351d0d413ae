"""The plugin author's API: the 25 names a backend distribution (ours or a vendor's) builds on.

A backend declares a :class:`Backend` in the ``hfexport.backends`` entry point group and subclasses
:class:`Exporter`: its :class:`Stage` s and :class:`Step` s, its ``tracer`` (``hfexport_dynamo.DYNAMO_TRACER``), what
its runtime needs from capture (:class:`RuntimeNeeds`), and ``prepare``/``lower``/``package``/``load_runner``. The
kernel's pipeline calls them in that order (``docs/architecture.md``); ``docs/writing-a-backend.md`` teaches a
generating backend. Workarounds are registered with the ``register_*`` decorators; runtimes that read a program file
subclass :class:`FileRunner` (or :class:`NamedIORunner`, for tensors by name).

What only some backends need lives in topical modules: :mod:`hfexport.trust` (reading untrusted files),
:mod:`hfexport.quantization`, :mod:`hfexport.workarounds` (patch contexts, applying fixes), :mod:`hfexport.artifact`
(manifest constants, output comparison); the user API in :mod:`hfexport` (errors, ``get_backend``).

Example (a vendor backend that decomposes to Core ATen)::

    from hfexport.plugin import Component, Exporter, Stage, Step
    from hfexport_dynamo import DYNAMO_TRACER, DynamoConfig

    class CoreAtenExporter(Exporter):
        name = "mybackend"
        config_class = DynamoConfig
        tracer = DYNAMO_TRACER
        stages = (Stage(1, "Core ATen decomposition", "internal"),)
        steps = (Step(1, "decompose", "ExportedProgram.run_decompositions"),)
        def lower(self, ctx):
            with ctx.stage(1), ctx.step("ExportedProgram.run_decompositions"):
                ctx.program = ctx.program.run_decompositions()
        def package(self, ctx): return self.artifact(ctx, [Component("model", MyRunner(ctx.program), ...)])
        @classmethod
        def load_runner(cls, path, manifest, component="model", *, trust_remote_code=False): ...

``docs/writing-a-backend.md`` has a complete one, which a test builds from the page.
"""

from ._artifact import Component, ExportedModel, component_manifest
from ._artifact_files import artifact_file
from ._context import ExportConfig, ExportContext, InvalidInputError, RuntimeNeeds
from ._discovery import Backend
from ._exporter import Exporter, Tracer
from ._named_io import NamedIORunner
from ._registry import (
    Registration,
    register_fx_node_fix,
    register_fx_program_fix,
    register_patch,
    register_workaround,
)
from ._runners import FileRunner, Runner
from ._stages import ExportError, Stage, StageEvent, Step
from ._tasks import ComponentPlan, TaskPlan

__all__ = [
    # the exporter and what it declares
    "Backend", "ExportConfig", "Exporter", "RuntimeNeeds", "Stage", "Step", "Tracer",
    # one export's state, its tasks, its errors and progress
    "ComponentPlan", "ExportContext", "ExportError", "InvalidInputError", "StageEvent", "TaskPlan",
    # the artifact and the runtimes that run it
    "Component", "ExportedModel", "FileRunner", "NamedIORunner", "Runner", "artifact_file", "component_manifest",
    # workarounds
    "Registration", "register_fx_node_fix", "register_fx_program_fix", "register_patch", "register_workaround",
]
