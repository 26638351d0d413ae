"""hfexport-dynamo: the ``dynamo`` backend (``torch.export`` to ``.pt2``) and Transformers model support.

The public capture API other backends build on: ``DYNAMO_TRACER`` (an exporter's ``tracer``: the kernel's pipeline
calls its ``capture``, the five dynamo stages and ``torch.export.export``, and ``plan_task`` for tasks) (also inputs from the config, pytrees, manifest descriptions, the eager
reference), :class:`GenerationOptions` (the options of a generation task), :class:`DynamoConfig` (backend configs extend it), :func:`dummy_inputs`,
:func:`register_cache_type` / :func:`register_transformers_pytrees`, :class:`TraceState` / :func:`trace_state` (what
the dynamo stages decided for one export: its dynamic shapes, the forward constants baked in), ``EXPORT_SKIPS``, and graph rewrites that
several backends apply (:func:`complex_to_real_pairs`, registered once as their ``_fix_complex_to_real_pairs``).

The generation layer, what a generative task exports and the one greedy loop over its programs, is
:mod:`hfexport_dynamo.tasks`.

Importing this package is light: it declares the backend for discovery; torch is imported when one of the
names above is used.
"""

from typing import Any

from hfexport.plugin import Backend

from .tasks.names import TASKS

DYNAMO_BACKEND = Backend(
    name="dynamo",
    exporter="hfexport_dynamo.exporter_dynamo:DynamoExporter",
    description="torch.export program (.pt2), run with torch.export.load",
    requires=("torch", "transformers"),
    distribution="hfexport-dynamo",
    tasks=TASKS,
)

_LAZY = {
    "DynamoConfig": "_config", "TraceState": "_config", "trace_state": "_config", "DynamoExporter": "exporter_dynamo", "DynamoRunner": "exporter_dynamo",
    "CAPTURE_STAGES": "capture", "PROGRAM_FILE": "exporter_dynamo",
    "GenerationOptions": "tasks.options", "ImageTextOptions": "tasks.options", "TaskOptions": "tasks.options",
    "DYNAMO_TRACER": "tracer", "DynamoTracer": "tracer",
    "EXPORT_SKIPS": "skips",
    "dummy_inputs": "inputs", "forward_parameters": "inputs",
    "register_cache_type": "_pytree", "register_transformers_pytrees": "_pytree",
    "read_pt2": "_pt2", "load_program": "_pt2",
    "ComplexRewriteError": "rewrites", "complex_to_real_pairs": "rewrites", "involves_complex": "rewrites",
    "squeeze_only_size_one_dims": "rewrites",
    "cache_attention": "_cache_attention",
}

__all__ = ["DYNAMO_BACKEND", "TASKS", *_LAZY]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
    raise AttributeError(f"module 'hfexport_dynamo' has no attribute {name!r}")
