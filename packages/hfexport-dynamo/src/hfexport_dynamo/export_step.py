"""The capture's toolchain step, ``torch.export.export`` (:func:`export_with_shared_dims`): one batch and one sequence
symbol across the token inputs, the retraces that widen a range torch.export narrowed or relax named ranges its
solver refused, and what the trace specialized (:func:`specialized_dims`, warned about by :func:`warn_specialized`)."""

from __future__ import annotations

import logging
import sys
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
import torch.utils._pytree as pytree
from torch.export import Dim

from hfexport.plugin import ExportContext

from ._config import trace_state
from ._guard_ranges import narrow_to_guards, narrow_to_pins
from .describe import _is_dynamic, _user_input_values, describe_inputs

logger = logging.getLogger("hfexport")

__all__ = ["SpecializedDimWarning", "export_with_shared_dims", "narrowed_dims", "specialized_dims",
           "specialized_message", "warn_specialized"]


class SpecializedDimWarning(UserWarning):
    """A dimension asked to be dynamic (``dynamic=True``, ``Dim.AUTO``) that torch.export fixed to its traced size."""


def _requested_dynamic(spec: Any) -> list[int]:
    """The dims a tensor's dynamic-shapes spec asks to be dynamic (anything but ``None``, ints, ``Dim.STATIC``)."""

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
            try:
                program = _export_with_ranges_as_hints(ctx, module, make_args, strict, exc)
            except UserError as refused:
                _refuse_recurrent_cells(ctx, refused)
                raise
        else:
            reason = next((line.strip(" -") for line in str(exc).splitlines()[1:] if line.strip()), str(exc))
            ctx.note(f"torch.export refused the dims shared across inputs (batch, sequence): {reason}; traced "
                     "again with Dim.AUTO on every dim")
            state.dynamic_shapes = auto
            program = torch.export.export(module, make_args(), dynamic_shapes=auto, strict=strict)
    program = _widen_narrowed_dims(ctx, module, make_args, strict, program)
    _narrow_to_pins(ctx, program)
    return program


def _narrow_to_pins(ctx: ExportContext, program: torch.export.ExportedProgram) -> None:
    """Narrow the ``Dim.AUTO`` dims (``dynamic=True``) that a guard of the trace pins (an expression of sizes equal
    to a constant: a patch count tied to a fixed position table) to the interval that guard admits around the
    example (:func:`hfexport_dynamo._guard_ranges.narrow_to_pins`), and note each: the manifest claims sizes the
    program takes, the export verifies its smallest shape there, and a size outside is refused by name and range.
    A range the user named stays as asked (the verification refuses the sizes its guards refuse), and so does a
    dim that guards only relate to another dynamic one (a batch that must not exceed another)."""
    from torch.export.dynamic_shapes import _DimHint

    specs = trace_state(ctx).dynamic_shapes
    if not specs or len(specs) != len(ctx.inputs):
        return
    auto = set()
    for name, spec in zip(ctx.inputs, specs, strict=True):
        items = spec.items() if isinstance(spec, Mapping) else enumerate(spec) if isinstance(spec, list | tuple) \
            else ()
        auto |= {(name, dim) for dim, hint in items if isinstance(hint, _DimHint) and hint is not Dim.STATIC
                 and getattr(hint, "min", None) is None and getattr(hint, "max", None) is None}
    changes = narrow_to_pins(program, ctx.inputs, auto) if auto else []
    if not changes:
        return
    guards = dict.fromkeys(guard for change in changes for guard in change["guards"])
    dims = [f"{', '.join(f'{name!r} dim {dim}' for name, dim in change['inputs'])} from "
            f"[{change['range'][0]}, {_end(change['range'][1])}] to [{change['admitted'][0]}, "
            f"{_end(change['admitted'][1])}]" for change in changes]
    ctx.note(f"a guard of the trace pins sizes to a value, which no range says ({'; '.join(guards)}): narrowed "
             f"{', '.join(dims)}, the sizes it admits around the example")


def _end(size: int | None) -> str:
    return "inf" if size is None else str(size)


def _refuse_recurrent_cells(ctx: ExportContext, exc: Exception) -> None:
    """Raise a ValueError naming the model's recurrent cells (``nn.GRUCell``, ``nn.LSTMCell``, ``nn.RNNCell``) when a
    dynamic dim was specialized and the model holds any: stepped in a Python loop over the time axis (the only way a
    cell runs over a sequence), they are unrolled for the traced length, which no rewrite can undo."""
    cells = [f"nn.{type(m).__name__} {name!r}" for name, m in ctx.model.named_modules()
             if isinstance(m, torch.nn.RNNCellBase)]
    if not cells or "Constraints violated" not in str(exc):
        return
    raise ValueError(
        f"{str(exc).splitlines()[0]} The model steps {', '.join(cells)} in a Python loop, which torch.export unrolls "
        "for the traced length, so the time axis cannot stay dynamic. Keep it static (drop it from dynamic_shapes), "
        "or use nn.GRU/nn.LSTM/nn.RNN over the whole sequence (exported as a scan over a dynamic time axis) or "
        "torch._higher_order_ops.scan") from exc


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


def warn_specialized(ctx: ExportContext) -> None:
    """Warn about each dim asked to be dynamic that the trace fixed; record them for the manifest (notes and
    ``specialized_dims``). Never fails the export: the description is best effort."""
    state = trace_state(ctx)
    if not state.dynamic_shapes:
        return
    try:
        fixed = specialized_dims(ctx.program, ctx.inputs, state.dynamic_shapes)
    except Exception as exc:  # noqa: BLE001
        logger.debug("could not compare the requested dynamic dims with the program's: %s", exc)
        return
    state.specialized_dims = fixed
    for entry in fixed:
        message = specialized_message(entry)
        ctx.note(message)
        warnings.warn(f"{ctx.model_class}: {message}", SpecializedDimWarning, stacklevel=2)
