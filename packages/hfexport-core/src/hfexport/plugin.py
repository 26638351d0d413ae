"""The plugin author's API: everything a backend distribution (ours or a vendor's) builds on.

A backend declares a :class:`Backend` in the ``hfexport.backends`` entry point group, subclasses
:class:`Exporter` with its stages, gets traced programs from a tracer (``hfexport_dynamo.DYNAMO_TRACER`` and
``hfexport_dynamo.trace``), registers workarounds of the kernel's kinds or of its own
(:func:`register_workaround`), and packages :class:`Component` s into an :class:`ExportedModel`. Runtimes that
read a program file subclass :class:`FileRunner`, or :class:`NamedIORunner` where they take and return tensors by
name. Nothing outside this module and :mod:`hfexport` is public.

Example (a vendor backend that decomposes to Core ATen)::

    from hfexport.plugin import Component, Exporter, Stage
    from hfexport_dynamo import DYNAMO_TRACER, DynamoConfig, trace

    class CoreAtenExporter(Exporter):
        name = "mybackend"
        config_class = DynamoConfig
        tracer = DYNAMO_TRACER
        stages = (Stage(1, "Trace", "the dynamo pipeline", "stage_trace", runs="torch.export.export"),)
        def stage_trace(self, ctx): trace(ctx)
        def package(self, ctx): return self.artifact(ctx, [Component("model", MyRunner(ctx.program), ...)])
"""

from ._artifact import (
    DEFAULT_COMPONENT,
    MANIFEST_NAME,
    SCHEMA_VERSION,
    Component,
    ExportedModel,
    FileRunner,
    OutputDiff,
    Runner,
    VerificationError,
    VerificationReport,
    compare_outputs,
    component_manifest,
    flatten_with_names,
    read_manifest,
    versions_of,
)
from ._discovery import Backend, UnknownBackendError, get_backend
from ._exporter import ExportConfig, ExportContext, Exporter, InvalidInputError, RuntimeNeeds, Tracer
from ._fx import FixReport, apply_fx_node_fixes, apply_fx_program_fixes, iter_graph_modules
from ._named_io import NamedIORunner
from ._patching import PatchReport, UnresolvedTarget, patch_context, resolve_path, resolve_pattern
from ._quantization import (
    Quantization,
    QuantizationRecipe,
    QuantizedVerificationReport,
    check_quantization_inputs,
    compare_quantized,
    file_bytes,
    quantized_model_reason,
    resolve_quantization,
    weight_bytes,
)
from ._registry import (
    Registration,
    is_disabled,
    list_workarounds,
    register_fx_node_fix,
    register_fx_program_fix,
    register_patch,
    register_workaround,
    workarounds_for,
)
from ._stages import ExportError, Stage, StageEvent, StagePath, Step
from ._tasks import ComponentPlan, TaskPlan
from ._trust import (
    SAFE_PICKLE_GLOBALS,
    IntegrityError,
    ManifestError,
    UntrustedArtifactError,
    allow_pytree_types,
    allowed_pytree_type,
    artifact_file,
    check_treespec,
    import_type_modules,
    importable_prefixes,
    load_treespec,
    parse_json,
    pickle_globals,
    torch_dtype,
    treespec_names,
    unregistered,
    unsafe_pickle_globals,
)

__all__ = [
    "Backend", "Component", "ComponentPlan", "DEFAULT_COMPONENT", "ExportConfig", "ExportContext", "ExportError", "ExportedModel",
    "Exporter", "FileRunner", "FixReport", "InvalidInputError", "MANIFEST_NAME", "NamedIORunner", "OutputDiff",
    "PatchReport",
    "Registration", "Runner", "SCHEMA_VERSION", "Stage", "StageEvent", "StagePath", "TaskPlan", "Tracer",
    "UnknownBackendError", "UnresolvedTarget", "VerificationError", "VerificationReport", "apply_fx_node_fixes",
    "apply_fx_program_fixes", "compare_outputs", "component_manifest", "flatten_with_names", "get_backend", "is_disabled",
    "iter_graph_modules", "list_workarounds", "patch_context", "read_manifest", "register_fx_node_fix",
    "register_fx_program_fix", "register_patch", "register_workaround", "resolve_path", "resolve_pattern",
    "RuntimeNeeds", "Step", "versions_of", "workarounds_for",
    # loading untrusted artifacts (hfexport._trust)
    "IntegrityError", "ManifestError", "SAFE_PICKLE_GLOBALS", "UntrustedArtifactError", "allow_pytree_types",
    "allowed_pytree_type", "artifact_file", "check_treespec", "import_type_modules", "importable_prefixes",
    "load_treespec", "parse_json", "pickle_globals", "torch_dtype", "treespec_names", "unregistered",
    "unsafe_pickle_globals",
    # quantized exports (hfexport._quantization)
    "Quantization", "QuantizationRecipe", "QuantizedVerificationReport", "check_quantization_inputs",
    "compare_quantized", "file_bytes", "quantized_model_reason", "resolve_quantization", "weight_bytes",
]
