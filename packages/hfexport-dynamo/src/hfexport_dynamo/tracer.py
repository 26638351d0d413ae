"""The dynamo tracer: what every backend built on ``torch.export`` gets from hfexport-dynamo.

``DYNAMO_TRACER`` builds dummy inputs from a Transformers config, registers caches as pytrees, describes a
traced program for the manifest (inputs with their dynamic dims, outputs by pytree path, the output spec),
writes the model's ``config.json`` beside the programs, and gives the eager reference to verify against.
The kernel's ``Exporter`` delegates to it when an exporter sets ``tracer = DYNAMO_TRACER``.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
import torch.utils._pytree as pytree

from hfexport.plugin import ExportContext, InvalidInputError, flatten_with_names

from ._config import trace_state
from ._guard_ranges import narrow_to_guards
from ._pytree import register_transformers_pytrees
from ._quiet import no_loading_bar
from .inputs import dummy_inputs, forward_parameters

__all__ = ["DYNAMO_TRACER", "IGNORED_KWARGS", "KWARG_ALIASES", "DynamoTracer", "SpecializedDimWarning",
           "describe_inputs", "describe_outputs", "export_with_shared_dims", "narrowed_dims", "specialized_dims",
           "specialized_message"]

logger = logging.getLogger("hfexport")

# Deprecated names transformers still accepts through **kwargs and renames inside forward (its
# ``_rename_kwargs_for_bc``): an input under such a name reaches the parameter it stands for.
KWARG_ALIASES: dict[str, str] = {"past_key_values": "cache", "cache_params": "cache"}

# Inputs current transformers ignores when they reach forward through **kwargs: transformers 5 removed head
# masks (no model of 5.24 reads ``head_mask``), but forwards with **kwargs still accept them, and Transformers' own
# model testers still pass them. An export drops them with a warning (``ignored_inputs`` in the manifest), and
# the artifact drops them again when called with them.
IGNORED_KWARGS: tuple[str, ...] = ("head_mask", "decoder_head_mask", "cross_attn_head_mask")


class DynamoTracer:
    """Transformers model support for exporters that trace with ``torch.export`` (see the module docstring).

    Attributes:
        toolchain: the distributions a trace depends on, for the manifest's ``versions`` (a backend adds its own).
        tested_versions: the versions this package was tested with (a backend adds its own).
    """

    toolchain: tuple[str, ...] = ("torch", "transformers", "hfexport-core", "hfexport-dynamo")
    scopes: tuple[str, ...] = ("dynamo",)  # the workaround scope every trace installs (stage 2)
    tested_versions: dict[str, str] = {"torch": "2.15.0", "transformers": "5.24.0"}

    def prepare_inputs(self, model: Any, inputs: Mapping[str, Any] | None) -> dict[str, Any] | None:
        """Dummy inputs from ``model.config`` when ``inputs`` is ``None`` and the model has a config."""
        if inputs is None and hasattr(model, "config"):
            return dummy_inputs(model)
        return None

    def check_inputs(self, inputs: Mapping[str, Any], model: Any = None) -> None:
        """Refuse, before any stage runs, inputs ``model`` cannot take as program inputs.

        * a name ``forward`` does not take (listing those it takes);
        * a tensor (or a pytree of tensors) whose name ``forward`` takes only through ``**kwargs``: it would
          become a program input that the model may never read, which every caller must then pass. Constants
          (``output_hidden_states=True``) may still go through ``**kwargs``: they are baked in, not inputs, and
          so may transformers' deprecated names of a parameter forward names (``past_key_values`` for ``cache``,
          :data:`KWARG_ALIASES`), which transformers renames inside forward, and the inputs transformers ignores
          (:data:`IGNORED_KWARGS`: ``head_mask``), which the export drops with a warning;
        * token ids (``input_ids``, ``decoder_input_ids``, ``token_type_ids``, ``position_ids``, any ``*_ids``)
          that are not an integer tensor.

        Raises:
            hfexport.InvalidInputError: naming the input and what to pass instead.
        """
        register_transformers_pytrees()  # so that Cache inputs flatten to tensors
        if not isinstance(inputs, Mapping):
            return  # the kernel's check names the problem
        for name, value in inputs.items():
            if isinstance(name, str) and name.endswith("_ids") and isinstance(value, torch.Tensor) and (
                    value.is_floating_point() or value.is_complex() or value.dtype == torch.bool):
                raise InvalidInputError(
                    f"input {name!r} is a {str(value.dtype).replace('torch.', '')} tensor; token ids must be "
                    f"integers (torch.long): pass {name}.long(), or float embeddings as inputs_embeds")
        if model is None or not hasattr(model, "forward"):
            return
        names, takes_kwargs = forward_parameters(model)
        constant = (bool, int, float, str, type(None))
        model_class = type(model).__name__
        unknown = [n for n in inputs if n not in names and not takes_kwargs]
        if unknown:
            raise InvalidInputError(f"{model_class}.forward takes no {', '.join(map(repr, unknown))}; it takes "
                                    f"{', '.join(names)}")
        through_kwargs = [n for n, v in inputs.items() if n not in names and not isinstance(v, constant)
                          and KWARG_ALIASES.get(n) not in names and n not in IGNORED_KWARGS]
        if through_kwargs:
            raise InvalidInputError(
                f"input {', '.join(map(repr, through_kwargs))} is not a parameter of {model_class}.forward: it "
                f"would reach forward only through **kwargs and become a program input the model may never "
                f"read. Drop it, or pass a model whose forward names it; forward's parameters: {', '.join(names)}")

    def prepare_load(self, manifest: dict[str, Any], *, trust_remote_code: bool = False) -> None:
        """Register the pytree types the manifest's output specs name, as far as the allow-list admits them
        (transformers' caches and ``ModelOutput`` types; any module with ``trust_remote_code``). Nothing is
        imported by the names in ``output_modules``; the kernel refuses a spec whose types stay unregistered."""
        from hfexport.plugin import treespec_names

        from ._pt2 import admit_types

        register_transformers_pytrees()  # so that saved outputs holding caches rebuild
        types: set[str] = set()
        enums: set[str] = set()
        for section in (manifest.get("components") or {"model": manifest}).values():
            spec = section.get("output_spec") if isinstance(section, dict) else None
            try:
                found_types, found_enums = treespec_names(spec) if isinstance(spec, str) else (set(), set())
            except ValueError:
                continue  # the kernel reports it
            types |= found_types
            enums |= found_enums
        admit_types(types, enums, trust_remote_code=trust_remote_code)

    def program_manifest(self, ctx: ExportContext, program: torch.export.ExportedProgram) -> dict[str, Any]:
        """A component's manifest keys: inputs, outputs, output spec (and the modules of its types)."""
        state = trace_state(ctx)
        return {
            "inputs": describe_inputs(program, ctx.inputs),
            "outputs": describe_outputs(program),
            "output_spec": pytree.treespec_dumps(program.call_spec.out_spec),
            "output_modules": sorted(_spec_modules(program.call_spec.out_spec)),
            "fixed_kwargs": {k: v.tolist() if isinstance(v, torch.Tensor) else v for k, v in state.fixed_kwargs.items()},
            # dims asked to be dynamic that the trace fixed (stage 5 warns about each)
            **({"specialized_dims": state.specialized_dims}
               if state.specialized_dims is not None and program is ctx.program else {}),
            # named Dim ranges torch.export's solver refused, traced as Dim.DYNAMIC over the same range
            **({"relaxed_dims": state.relaxed_dims} if state.relaxed_dims is not None and program is ctx.program
               else {}),
            # inputs forward took through **kwargs and transformers ignores: dropped, also from later calls
            **({"ignored_inputs": state.ignored_inputs} if state.ignored_inputs else {}),
        }

    def extra_files(self, ctx: ExportContext) -> dict[str, Any]:
        """The model's ``config.json``, saved beside the programs when the model has a config."""
        config = getattr(ctx.model, "config", None)
        if config is None or not hasattr(config, "to_json_file"):
            return {}
        return {"config.json": lambda d: config.to_json_file(d / "config.json")}

    def plan_task(self, model: Any, task: str, inputs: Mapping[str, Any] | None = None, *,
                  max_cache_len: int | None = None, max_batch: int | None = None, prefill_chunk: int | None = None,
                  max_images: int | None = None, stateful: bool = False, fused_cache_attention: Any = False) -> Any:
        """The components a generative ``task`` exports (see :func:`hfexport_dynamo.generation.plan_task`;
        ``"image-text-to-text"``, ``"audio-text-to-text"``: :func:`hfexport_dynamo._image_text.plan_image_text`)."""
        from ._task_names import MEDIA_TASKS
        from .generation import plan_task

        if task in MEDIA_TASKS:
            from ._image_text import plan_image_text

            return plan_image_text(model, inputs, task=task, max_cache_len=max_cache_len, max_batch=max_batch,
                                   prefill_chunk=prefill_chunk, max_images=max_images, stateful=stateful,
                                   fused_cache_attention=fused_cache_attention)
        return plan_task(model, task, inputs, max_cache_len=max_cache_len, max_batch=max_batch,
                         prefill_chunk=prefill_chunk, max_images=max_images, stateful=stateful,
                         fused_cache_attention=fused_cache_attention)

    def generate(self, exported: Any, input_ids: Any, attention_mask: Any = None, **options: Any) -> Any:
        """Greedy decoding over a task artifact's programs (see :func:`hfexport_dynamo.generation.generate`)."""
        from .generation import generate

        return generate(exported, input_ids, attention_mask, **options)

    def reference(self, ctx: ExportContext) -> Any:
        model, fixed = ctx.model, dict(trace_state(ctx).fixed_kwargs)
        return lambda **kw: model(**{**fixed, **kw})  # a fixed kwarg passed again (equal: the artifact checks)

    def load_model(self, path: str | Path) -> torch.nn.Module:
        """``AutoModel`` from a local directory (offline); the task head from ``config.architectures``."""
        import transformers

        config = transformers.AutoConfig.from_pretrained(path)
        arch = (getattr(config, "architectures", None) or [None])[0]
        model_cls = getattr(transformers, arch, None) if arch else None
        with no_loading_bar():
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


    def second_shape_inputs(self, ctx: ExportContext, inputs: Mapping[str, Any]) -> dict[str, Any] | None:
        """``inputs`` at a second shape for the export's verification: each symbol of the program's dynamic input
        dims moved by one (up, else down) within its range, so that its parity differs from the traced one; each
        tensor resized along those dims by truncating or by repeating its own leading slices, so that token ids
        and masks stay valid. None when nothing can move (static, or every range a single size)."""
        return second_shape_inputs(ctx.program, inputs)


DYNAMO_TRACER = DynamoTracer()


def _resized(tensor: torch.Tensor, dim: int, size: int) -> torch.Tensor:
    """``tensor`` truncated, or extended by repeating its leading slices, to ``size`` along ``dim``."""
    if size <= tensor.shape[dim]:
        return tensor.narrow(dim, 0, size).clone()
    if tensor.dim() == 1 and tensor.numel() > 1 and not tensor.is_floating_point() \
            and bool((tensor[1:] >= tensor[:-1]).all()):
        # a sorted index (cumulative sequence lengths, offsets) extended with its last value stays sorted, where
        # a copy of its leading values would not (searchsorted over [0, 3, 5, 8, 0] has no defined answer)
        return torch.cat([tensor, tensor[-1:].expand(size - tensor.shape[0])])
    parts, have = [tensor], tensor.shape[dim]
    while have < size:
        take = min(tensor.shape[dim], size - have)
        parts.append(tensor.narrow(dim, 0, take))
        have += take
    return torch.cat(parts, dim=dim)


def second_shape_inputs(program: torch.export.ExportedProgram | None,
                        inputs: Mapping[str, Any]) -> dict[str, Any] | None:
    """See :meth:`DynamoTracer.second_shape_inputs`."""
    if program is None:
        return None
    placeholders = {n.name: n for n in program.graph.nodes if n.op == "placeholder"}
    specs = [s for s in program.graph_signature.input_specs if s.kind.name == "USER_INPUT"]
    vals = [placeholders[s.arg.name].meta.get("val") if hasattr(s.arg, "name") else None for s in specs]
    leaves, spec = pytree.tree_flatten(dict(inputs))
    if len(leaves) != len(vals):
        return None  # inputs folded in as constants, or a container the program sees otherwise
    shape_env = next((getattr(getattr(v, "fake_mode", None), "shape_env", None) for v in vals
                      if isinstance(v, torch.Tensor)), None)
    if shape_env is None:
        return None
    symbols: dict[Any, int] = {}
    for val in vals:
        for size in val.shape if isinstance(val, torch.Tensor) else ():
            if _is_dynamic(size):
                for symbol in size.node.expr.free_symbols:
                    hint = getattr(shape_env, "backed_var_to_val", None) or shape_env.var_to_val
                    hint = hint.get(symbol)
                    if hint is not None:
                        symbols[symbol] = int(hint)
    moved: dict[Any, int] = {}
    for symbol, hint in symbols.items():
        rng = program.range_constraints.get(symbol)
        lower = max(2, int(rng.lower)) if rng is not None else 2
        try:
            upper = int(rng.upper) if rng is not None else hint + 1
        except (TypeError, OverflowError, AttributeError):  # int_oo
            upper = hint + 1
        moved[symbol] = hint + 1 if hint + 1 <= upper else hint - 1 if hint - 1 >= lower else hint
    if all(moved[s] == symbols[s] for s in moved):
        return None
    out = []
    for leaf, val in zip(leaves, vals, strict=True):
        if isinstance(leaf, torch.Tensor) and isinstance(val, torch.Tensor):
            for dim, size in enumerate(val.shape):
                if _is_dynamic(size):
                    leaf = _resized(leaf, dim, int(size.node.expr.xreplace(moved)))
        out.append(leaf)
    return pytree.tree_unflatten(out, spec)



def _spec_modules(spec: Any) -> set[str]:
    out = set()
    if spec.type is not None and spec.type.__module__ not in ("builtins", "collections"):
        out.add(spec.type.__module__)
    for child in spec.children():
        out |= _spec_modules(child)
    return out


def _is_dynamic(size: Any) -> bool:
    """Whether a traced size is symbolic (a SymInt whose symbol was replaced by a constant is not)."""
    return isinstance(size, torch.SymInt) and not getattr(size.node.expr, "is_number", False)


def _dims(value: Any, program: torch.export.ExportedProgram) -> tuple[list[Any], dict[str, Any]]:
    shape, dynamic = [], {}
    for i, size in enumerate(value.shape):
        if _is_dynamic(size):
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


def _user_input_values(program: torch.export.ExportedProgram) -> list[Any]:
    """The traced values (``meta["val"]``: fake tensors, ints) of the program's user inputs, flat, in order."""
    placeholders = {n.name: n for n in program.graph.nodes if n.op == "placeholder"}
    specs = [s for s in program.graph_signature.input_specs if s.kind.name == "USER_INPUT"]
    return [placeholders[s.arg.name].meta.get("val") for s in specs if hasattr(s.arg, "name")]


def describe_inputs(program: torch.export.ExportedProgram, examples: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Name, dtype, shape (symbols for dynamic dims) and dynamic dims of every user input leaf."""
    leaves = _user_input_values(program)
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


class SpecializedDimWarning(UserWarning):
    """A dimension asked to be dynamic (``dynamic=True``, ``Dim.AUTO``) that torch.export fixed to its traced size."""


def _requested_dynamic(spec: Any) -> list[int]:
    """The dims a tensor's dynamic-shapes spec asks to be dynamic (anything but ``None``, ints, ``Dim.STATIC``)."""
    from torch.export import Dim

    if isinstance(spec, Mapping):
        items = list(spec.items())
    elif isinstance(spec, list | tuple):
        items = list(enumerate(spec))
    else:
        return []
    return [d for d, s in items if isinstance(d, int) and s is not None and not isinstance(s, int)
            and s is not Dim.STATIC]


def _leaf_specs(value: Any, spec: Any) -> list[tuple[int | None, Any, Any]]:
    """``(leaf index or None for a tensor input, leaf, its spec)`` for the tensor leaves ``spec`` covers."""
    if isinstance(value, torch.Tensor):
        return [(None, value, spec)]
    leaves = pytree.tree_leaves(value)
    if isinstance(spec, list | tuple) and len(spec) == len(leaves):  # _auto_spec's shape: one spec per leaf
        return [(i, leaf, s) for i, (leaf, s) in enumerate(zip(leaves, spec, strict=True))
                if isinstance(leaf, torch.Tensor)]
    return []  # another structure: not checked


def _why_fixed(shape_env: Any, name: str, dim: int, size: int) -> dict[str, str]:
    """The guard that fixed ``name``'s ``dim`` (best effort: torch's shape environment is not public API)."""
    if size in (0, 1):
        return {"reason": f"the traced size is {size}, and torch.export always specializes sizes 0 and 1: trace "
                          "with a size of at least 2 along this dim"}
    out = {"reason": "the model's code fixes it (a shape check, a reshape to a constant size, or a branch on "
                     "the size)"}
    try:
        source = f"L['{name}'].size()[{dim}]"
        symbol = next(s for s, sources in shape_env.var_to_sources.items() if any(x.name == source for x in sources))
        guards = [g for g in shape_env.guards if symbol in g.expr.free_symbols]
        # The guard that fixed it: an equality on this size alone; else where the symbol was replaced by a
        # constant; else the first guard on it.
        fixing = next((g for g in guards if type(g.expr).__name__ == "Equality" and len(g.expr.free_symbols) == 1),
                      None)
        slocs = getattr(shape_env, "replacements_slocs", {})
        if fixing is not None:
            out["guard"], sloc = str(fixing.expr).replace(str(symbol), f"{name}.size({dim})"), fixing.sloc
        elif symbol in slocs:
            out["guard"], sloc = f"{name}.size({dim}) == {size}", slocs[symbol]
        elif guards:
            out["guard"], sloc = str(guards[0].expr).replace(str(symbol), f"{name}.size({dim})"), guards[0].sloc
        else:
            sloc = None
        if sloc is not None:
            loc = sloc.maybe_user_loc or sloc.framework_loc
            if loc is not None:
                out["where"] = f"{'/'.join(Path(loc.filename).parts[-3:])}:{loc.lineno} in {loc.name}" \
                    if hasattr(loc, "lineno") else str(loc)
    except Exception:  # noqa: BLE001 - a hint only
        pass
    return out


def specialized_dims(program: torch.export.ExportedProgram, inputs: Mapping[str, Any],
                     dynamic_shapes: Any) -> list[dict[str, Any]]:
    """The dims asked to be dynamic (by ``dynamic=True`` or ``dynamic_shapes``) that ``program`` fixed.

    Returns:
        One entry per fixed dim: ``input`` (with ``[i]`` for a leaf of a cache or nested input), ``dim``,
        ``size`` (the traced size it was fixed to), ``reason``, and where torch recorded it, the ``guard`` and
        ``where`` it was added.
    """
    if not dynamic_shapes:
        return []
    placeholders = {n.name: n for n in program.graph.nodes if n.op == "placeholder"}
    specs = [s for s in program.graph_signature.input_specs if s.kind.name == "USER_INPUT"]
    vals = [placeholders[s.arg.name].meta.get("val") if hasattr(s.arg, "name") else None for s in specs]
    shape_env = next((getattr(getattr(v, "fake_mode", None), "shape_env", None) for v in vals
                      if isinstance(v, torch.Tensor)), None)
    out, offset = [], 0
    for (name, value), spec in zip(inputs.items(), dynamic_shapes, strict=True):
        n_leaves = len(pytree.tree_leaves(value))
        leaf_vals = vals[offset:offset + n_leaves]
        offset += n_leaves
        for index, _leaf, leaf_spec in _leaf_specs(value, spec):
            traced = leaf_vals[index or 0] if len(leaf_vals) > (index or 0) else None
            if not isinstance(traced, torch.Tensor):
                continue
            for dim in _requested_dynamic(leaf_spec):
                if dim >= traced.dim() or _is_dynamic(traced.shape[dim]):
                    continue
                label = name if index is None else f"{name}[{index}]"
                entry: dict[str, Any] = {"input": label, "dim": dim, "size": int(traced.shape[dim])}
                entry.update(_why_fixed(shape_env, name, dim, entry["size"]) if index is None else
                             _why_fixed(None, name, dim, entry["size"]))
                out.append(entry)
    return out


def specialized_message(entry: Mapping[str, Any]) -> str:
    """One line for a :func:`specialized_dims` entry (the warning and the manifest note)."""
    guard = f" (guard {entry['guard']}" + (f" at {entry['where']}" if entry.get("where") else "") + ")" \
        if entry.get("guard") else ""
    return (f"input {entry['input']!r} dim {entry['dim']} was asked to be dynamic but torch.export fixed it to "
            f"{entry['size']}: {entry['reason']}{guard}; the program accepts only size {entry['size']} there")


def export_with_shared_dims(ctx: ExportContext, module: Any, make_args: Any, strict: bool) -> torch.export.ExportedProgram:
    """``torch.export.export`` with the trace state's ``dynamic_shapes``; when those hold the named dims of
    :func:`hfexport_dynamo.inputs.shared_dims` (its ``auto_dynamic_shapes`` is then the plain
    ``Dim.AUTO`` spec) and torch.export refuses them (a constraint violation: the model fixes the batch, or
    relates the sequence to another size), trace again with ``Dim.AUTO`` on every dim and say so in the notes.

    Args:
        make_args: returns fresh positional inputs (a failed trace may have changed a cache passed in).
    """
    from torch._dynamo.exc import UserError, UserErrorType

    state = trace_state(ctx)
    auto = state.auto_dynamic_shapes
    try:
        program = torch.export.export(module, make_args(), dynamic_shapes=state.dynamic_shapes, strict=strict)
    except UserError as exc:
        if exc.error_type is not UserErrorType.CONSTRAINT_VIOLATION:
            raise
        if auto is None:
            program = _export_with_ranges_as_hints(ctx, module, make_args, strict, exc)
        else:
            reason = next((line.strip(" -") for line in str(exc).splitlines()[1:] if line.strip()), str(exc))
            ctx.note(f"torch.export refused the dims shared across inputs (batch, sequence): {reason}; traced "
                     "again with Dim.AUTO on every dim")
            state.dynamic_shapes = auto
            program = torch.export.export(module, make_args(), dynamic_shapes=auto, strict=strict)
    return _widen_narrowed_dims(ctx, module, make_args, strict, program)


def narrowed_dims(program: torch.export.ExportedProgram, inputs: Mapping[str, Any], dynamic_shapes: Any,
                  model: Any = None) -> list[dict[str, Any]]:
    """The dynamic dims of ``program``'s top-level tensor inputs whose range ends below twice the example's size
    though the spec asked for no such bound: ``{"input", "dim", "size", "range": [min, max]}`` each. A range
    that ends at the model's position limit (:func:`hfexport_dynamo.inputs.max_positions`) is the model's and
    is left out."""
    from .inputs import max_positions

    if not dynamic_shapes:
        return []
    limits = {limit[0] for role in ("sequence", "decoder_sequence") if (limit := max_positions(model, role))}
    described = {entry["name"]: entry for entry in describe_inputs(program, inputs)}
    out = []
    for (name, value), spec in zip(inputs.items(), dynamic_shapes, strict=True):
        if not isinstance(value, torch.Tensor):
            continue
        items = spec.items() if isinstance(spec, Mapping) else enumerate(spec) if isinstance(spec, list | tuple) \
            else ()
        for dim, dim_spec in items:
            if dim not in _requested_dynamic(spec):
                continue
            size, asked = int(value.shape[dim]), getattr(dim_spec, "max", None)
            if isinstance(asked, int) and asked < min(2 * size, sys.maxsize - 1):
                continue  # the user's bound
            got = described.get(name, {}).get("dynamic_dims", {}).get(str(dim))
            if got and got["max"] is not None and got["max"] < 2 * size and got["max"] not in limits:
                out.append({"input": name, "dim": dim, "size": size, "range": [got["min"], got["max"]]})
    return out


def _media_twice_as_large(program: torch.export.ExportedProgram, args: tuple[Any, ...]) -> list[Any] | None:
    """The program's flat user inputs as meta tensors, with every dynamic dim past the batch and channels (dim 2 on)
    of its top-level floating-point inputs of 3 or more dims (images, video, audio features) doubled; None when no
    such dim is dynamic. Other inputs keep their sizes: their dims may be shared with the media's batch, and a
    cache's leaves are tied to positions and masks."""
    values = _user_input_values(program)
    media = [isinstance(arg, torch.Tensor) and arg.is_floating_point() and arg.dim() >= 3 for arg in args]
    leaves = [(leaf, is_media) for arg, is_media in zip(args, media, strict=True) for leaf in pytree.tree_leaves(arg)]
    if len(values) != len(leaves):
        return None
    out, doubled = [], False
    for (leaf, is_media), fake in zip(leaves, values, strict=True):
        if not isinstance(leaf, torch.Tensor):
            out.append(leaf)
            continue
        shape = list(leaf.shape)
        if is_media and isinstance(fake, torch.Tensor):
            for dim in range(2, leaf.dim()):
                if _is_dynamic(fake.shape[dim]):
                    shape[dim], doubled = 2 * shape[dim], True
        out.append(torch.empty(shape, dtype=leaf.dtype, device="meta"))
    return out if doubled else None


def _guards_refuse(program: torch.export.ExportedProgram, flat_inputs: list[Any]) -> bool:
    """Whether the program's input guards (the ranges and the shape guards it runs before its graph, which torch
    builds as ``program.module()._guards_fn``) refuse ``flat_inputs``; only their sizes are read."""
    guards = getattr(program.module(), "_guards_fn", None)
    if guards is None:
        return False
    try:
        guards(*flat_inputs)
    except AssertionError:  # torch._assert of a failed guard
        return True
    except Exception:  # noqa: BLE001 - a guard these inputs cannot evaluate: no evidence of a refusal
        return False
    return False


def _widen_narrowed_dims(ctx: ExportContext, module: Any, make_args: Any, strict: bool,
                         program: torch.export.ExportedProgram) -> torch.export.ExportedProgram:
    """Trace again with size-oblivious guards when the trace bounded a dynamic dim below twice its example
    (:func:`narrowed_dims`), or its guards refuse the example's images (video, audio features) at twice their
    dynamic sizes; keep the new program when it bounds none of those dims lower (and its guards take the larger
    images), and note it.

    A size that is 1 inside the model at the traced shape (ConvNext's last stage is 1x1 for a 32x32 image, 32
    times smaller) makes torch's contiguity and broadcasting checks guard on it (``Max(1, s//32) <= 1``), which
    bounds the input to ``[32, 63]``: the program refuses 64x64 though the model runs it. Where the image size
    goes through padding arithmetic first (MobileNetV2's "SAME" padding, 32x32 traced), the guards are not ranges
    but expressions (``Max(1, (s + (-s) % 2) // 2 ...) > 1``) that refuse 64x64 all the same. With
    ``torch.fx.experimental._config.backed_size_oblivious`` those checks take the general answer, as they do for
    unbacked sizes, and add no guard. The export's verification then checks the program at the traced shape
    (where that size is 1) and at a second shape. The setting stays on for the rest of the export's stages
    (``ctx.stack``): a backend's retraces of the program evaluate those checks again."""
    state = trace_state(ctx)
    narrowed = narrowed_dims(program, ctx.inputs, state.dynamic_shapes, ctx.model)
    guarded = getattr(program, "_guards_code", None)  # its shape guards as code (torch 2.15); empty: none to check
    larger_media = None if narrowed or not guarded else _media_twice_as_large(program, make_args())
    if not narrowed and not (larger_media is not None and _guards_refuse(program, larger_media)):
        return program
    from torch.fx.experimental import _config as fx_config

    try:
        # on copies of the input tensors: a trace that fails leaves torch's dynamic-dim markers (``_dynamo_*``
        # attributes) on its inputs, which the first program's example inputs share (and a saved .pt2 would carry)
        copies = pytree.tree_map_only(torch.Tensor, torch.Tensor.clone, make_args())
        with fx_config.patch(backed_size_oblivious=True):
            retried = torch.export.export(module, copies, dynamic_shapes=state.dynamic_shapes, strict=strict)
    except Exception as exc:  # noqa: BLE001 - the first program stands
        logger.debug("the size-oblivious retrace failed: %s", exc)
        return program
    described = {entry["name"]: entry for entry in describe_inputs(retried, ctx.inputs)}
    widened = []
    for entry in narrowed:
        got = described.get(entry["input"], {}).get("dynamic_dims", {}).get(str(entry["dim"]))
        if got is None or (got["min"] or 0) > entry["range"][0]:
            return program  # fixed or narrowed from below: not better
        if got["max"] is not None and got["max"] <= entry["range"][1]:
            continue
        widened.append(f"{entry['input']!r} dim {entry['dim']} from {entry['range']} to "
                       f"[{got['min']}, {got['max'] if got['max'] is not None else 'inf'}]")
    if larger_media is not None:
        if narrowed_dims(retried, ctx.inputs, state.dynamic_shapes, ctx.model) or \
                _media_twice_as_large(retried, make_args()) is None or _guards_refuse(retried, larger_media):
            return program
        ctx.note("the trace's guards refused the example's images (video, audio features) at twice their dynamic "
                 "sizes (a size of 1 inside the model at the traced shape); traced again with size-oblivious "
                 "guards, which take them")
    elif not widened:
        return program
    else:
        ctx.note(f"the trace bounded dynamic dims below twice their example (a size of 1 inside the model at the "
                 f"traced shape); traced again with size-oblivious guards, which widened {', '.join(widened)}")
    # The backend's own retraces (decompositions, ExecuTorch's lowering) evaluate the same checks again: without
    # the setting they would add the guards back and narrow the ranges ExecuTorch plans memory for.
    ctx.stack.enter_context(fx_config.patch(backed_size_oblivious=True))
    return retried


def _ranges_as_hints(spec: Any, found: list[dict[str, Any]], where: dict[str, Any]) -> Any:
    """``spec`` with every named ``Dim`` (and derived dim such as ``4 * h``) replaced by ``Dim.DYNAMIC`` over
    the same range; each replaced dim is listed in ``found`` (with ``where``: the input, and the dim index)."""
    from torch.export.dynamic_shapes import _DerivedDim, _Dim

    if isinstance(spec, _Dim | _DerivedDim):
        lower, upper = int(spec.min), spec.max
        upper = None if upper is None or upper >= sys.maxsize - 1 else int(upper)
        found.append({**where, "name": spec.__name__, "min": lower, "max": upper})
        return torch.export.Dim.DYNAMIC(min=lower, max=upper) if upper is not None else \
            torch.export.Dim.DYNAMIC(min=lower)
    if isinstance(spec, Mapping):
        return {k: _ranges_as_hints(v, found, {**where, "dim": k}) for k, v in spec.items()}
    if isinstance(spec, list | tuple):
        return type(spec)(_ranges_as_hints(v, found, {**where, "dim": i}) for i, v in enumerate(spec))
    return spec


def _export_with_ranges_as_hints(ctx: ExportContext, module: Any, make_args: Any, strict: bool,
                                 exc: Exception) -> torch.export.ExportedProgram:
    """Trace again with the user's named ``Dim(min=, max=)`` as ``Dim.DYNAMIC(min=, max=)`` after a constraint
    violation, keeping each range as the program's checked bound (torch.export's input check refuses sizes
    outside it); warn, note, and record the dims in the trace state's ``relaxed_dims`` (the manifest's
    ``relaxed_dims``, with the range the program checks). A named dim goes through torch.export's solver, which
    refuses a range when it cannot prove every guard over all of it, including guards that hold for every size
    (``h <= 2*((h + 1)//2)`` from padding to even sizes); a ``Dim.DYNAMIC`` hint keeps such guards as checks
    (pytorch/pytorch#146315). torch.onnx retries the same way. Re-raises the original error when the spec holds
    no named dim, or when the retry fails too."""
    state = trace_state(ctx)
    if not state.dynamic_shapes:
        raise exc
    found: list[dict[str, Any]] = []
    relaxed = tuple(_ranges_as_hints(spec, found, {"input": name})
                    for name, spec in zip(ctx.inputs, state.dynamic_shapes, strict=True))
    if not found:
        raise exc
    try:
        program = torch.export.export(module, make_args(), dynamic_shapes=relaxed, strict=strict)
    except Exception:
        raise exc from None
    narrow_to_guards(program, ctx.inputs)  # sizes of the range that the program's own guards refuse
    reason = next((line.strip(" -") for line in str(exc).splitlines()[1:] if line.strip()), str(exc))
    described = {entry["name"]: entry for entry in describe_inputs(program, ctx.inputs)}
    narrowed = []
    for entry in found:
        dims = described.get(entry["input"], {}).get("dynamic_dims", {})
        got = dims.get(str(entry.get("dim")))
        entry["checked"] = [got["min"], got["max"]] if got else "static"
        if got is None or (got["min"] is not None and got["min"] > entry["min"]) or (
                got["max"] is not None and entry["max"] is not None and got["max"] < entry["max"]):
            narrowed.append(f"{entry['name']} to {entry['checked']}")
    message = (f"torch.export's solver refused the named dims {', '.join(dict.fromkeys(e['name'] for e in found))} "
               f"({reason}); traced again with Dim.DYNAMIC over the same ranges, which the program checks when "
               "called" + (f"; the trace narrowed {', '.join(narrowed)}" if narrowed else ""))
    logger.warning(message)
    ctx.note(message)
    state.relaxed_dims = found
    state.dynamic_shapes = relaxed
    return program
