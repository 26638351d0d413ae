"""The dynamo tracer: what every backend built on ``torch.export`` gets from hfexport-dynamo.

``DYNAMO_TRACER`` builds dummy inputs from a Transformers config, registers caches as pytrees, describes a
traced program for the manifest (inputs with their dynamic dims, outputs by pytree path, the output spec),
writes the model's ``config.json`` beside the programs, and gives the eager reference to verify against.
The kernel's ``Exporter`` delegates to it when an exporter sets ``tracer = DYNAMO_TRACER``.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
import torch.utils._pytree as pytree

from hfexport.plugin import ExportContext, flatten_with_names

from ._pytree import register_transformers_pytrees
from .inputs import dummy_inputs

__all__ = ["DYNAMO_TRACER", "DynamoTracer", "describe_inputs", "describe_outputs"]

logger = logging.getLogger("hfexport")


class DynamoTracer:
    """Transformers model support for exporters that trace with ``torch.export`` (see the module docstring).

    Attributes:
        toolchain: the distributions a trace depends on, for the manifest's ``versions`` (a backend adds its own).
        tested_versions: the versions this package was tested with (a backend adds its own).
    """

    toolchain: tuple[str, ...] = ("torch", "transformers", "hfexport-core", "hfexport-dynamo")
    tested_versions: dict[str, str] = {"torch": "2.15.0", "transformers": "5.24.0"}

    def prepare_inputs(self, model: Any, inputs: Mapping[str, Any] | None) -> dict[str, Any] | None:
        """Dummy inputs from ``model.config`` when ``inputs`` is ``None`` and the model has a config."""
        if inputs is None and hasattr(model, "config"):
            return dummy_inputs(model)
        return None

    def check_inputs(self, inputs: Mapping[str, Any]) -> None:
        register_transformers_pytrees()  # so that Cache inputs flatten to tensors

    def prepare_load(self, manifest: dict[str, Any]) -> None:
        register_transformers_pytrees()  # so that saved outputs holding caches rebuild

    def program_manifest(self, ctx: ExportContext, program: torch.export.ExportedProgram) -> dict[str, Any]:
        """A component's manifest keys: inputs, outputs, output spec (and the modules of its types)."""
        return {
            "inputs": describe_inputs(program, ctx.inputs),
            "outputs": describe_outputs(program),
            "output_spec": pytree.treespec_dumps(program.call_spec.out_spec),
            "output_modules": sorted(_spec_modules(program.call_spec.out_spec)),
            "fixed_kwargs": ctx.extras.get("fixed_kwargs", {}),
        }

    def extra_files(self, ctx: ExportContext) -> dict[str, Any]:
        """The model's ``config.json``, saved beside the programs when the model has a config."""
        config = getattr(ctx.model, "config", None)
        if config is None or not hasattr(config, "to_json_file"):
            return {}
        return {"config.json": lambda d: config.to_json_file(d / "config.json")}

    def reference(self, ctx: ExportContext) -> Any:
        model, fixed = ctx.model, dict(ctx.extras.get("fixed_kwargs", {}))
        return lambda **kw: model(**kw, **fixed)

    def load_model(self, path: str | Path) -> torch.nn.Module:
        """``AutoModel`` from a local directory (offline); the task head from ``config.architectures``."""
        import transformers

        config = transformers.AutoConfig.from_pretrained(path)
        arch = (getattr(config, "architectures", None) or [None])[0]
        model_cls = getattr(transformers, arch, None) if arch else None
        return (model_cls or transformers.AutoModel).from_pretrained(path).eval()

    def sample_inputs(self, model: Any, manifest: dict[str, Any]) -> dict[str, Any] | None:
        """Dummy inputs at batch+1 and seq+5 along the dims the program kept dynamic (traced size otherwise)."""
        if not hasattr(model, "config"):
            return None
        ids = next((i for i in manifest["inputs"] if i["name"] in ("input_ids", "pixel_values", "input_features",
                                                                   "input_values")), None)
        if ids is None or "example_shape" not in ids:
            return None
        batch, rest = ids["example_shape"][0], ids["example_shape"][1:]
        seq = rest[0] if rest else 8
        dynamic = ids.get("dynamic_dims", {})
        return dummy_inputs(model, batch=batch + 1 if "0" in dynamic else batch,
                            seq=seq + 5 if "1" in dynamic and ids["name"] == "input_ids" else seq, seed=1)


DYNAMO_TRACER = DynamoTracer()



def _spec_modules(spec: Any) -> set[str]:
    out = set()
    if spec.type is not None and spec.type.__module__ not in ("builtins", "collections"):
        out.add(spec.type.__module__)
    for child in spec.children():
        out |= _spec_modules(child)
    return out


def _dims(value: Any, program: torch.export.ExportedProgram) -> tuple[list[Any], dict[str, Any]]:
    shape, dynamic = [], {}
    for i, size in enumerate(value.shape):
        if isinstance(size, torch.SymInt):
            symbol = size.node.expr
            rng = program.range_constraints.get(symbol)
            try:
                upper = int(rng.upper) if rng is not None else None
            except (TypeError, AttributeError, OverflowError):  # int_oo: unbounded
                upper = None
            dynamic[str(i)] = {"symbol": str(symbol), "min": int(rng.lower) if rng else None, "max": upper}
            shape.append(str(symbol))
        else:
            shape.append(int(size))
    return shape, dynamic


def describe_inputs(program: torch.export.ExportedProgram, examples: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Name, dtype, shape (symbols for dynamic dims) and dynamic dims of every user input leaf."""
    placeholders = {n.name: n for n in program.graph.nodes if n.op == "placeholder"}
    specs = [s for s in program.graph_signature.input_specs if s.kind.name == "USER_INPUT"]
    leaves = [placeholders[s.arg.name].meta.get("val") for s in specs if hasattr(s.arg, "name")]
    in_spec = program.call_spec.in_spec.children()[0]  # (args, kwargs) -> args
    out, offset = [], 0
    for name, child in zip(examples, in_spec.children(), strict=True):
        n = child.num_leaves
        entry: dict[str, Any] = {"name": name, "leaves": n}
        vals = [v for v in leaves[offset:offset + n] if isinstance(v, torch.Tensor)]
        if n == 1 and vals:
            entry["dtype"] = str(vals[0].dtype).replace("torch.", "")
            entry["shape"], entry["dynamic_dims"] = _dims(vals[0], program)
            if isinstance(examples.get(name), torch.Tensor):
                entry["example_shape"] = list(examples[name].shape)
        else:
            entry["type"] = str(child.type.__name__) if child.type else "leaf"
        out.append(entry)
        offset += n
    return out


def describe_outputs(program: torch.export.ExportedProgram) -> list[dict[str, Any]]:
    """Name (dotted pytree path), dtype and shape of every output leaf."""


    spec = program.call_spec.out_spec
    output_node = next(n for n in program.graph.nodes if n.op == "output")
    user_outputs = [s for s in program.graph_signature.output_specs if s.kind.name == "USER_OUTPUT"]
    vals = {a.name: a.meta.get("val") for a in output_node.args[0] if isinstance(a, torch.fx.Node)}
    # Tensor placeholders (not ints): attribute-walked cache types classify their children by type.
    names, _, _ = flatten_with_names(pytree.tree_unflatten([torch.empty(0)] * spec.num_leaves, spec))
    if len(names) != len(user_outputs):
        logger.warning("output spec has %d leaves but the program %d user outputs: names may be off",
                       len(names), len(user_outputs))
    out = []
    for name, s in zip(names, user_outputs, strict=False):
        val = vals.get(getattr(s.arg, "name", None))
        entry: dict[str, Any] = {"name": name}
        if isinstance(val, torch.Tensor):
            entry["dtype"] = str(val.dtype).replace("torch.", "")
            entry["shape"], _ = _dims(val, program)
        out.append(entry)
    return out
