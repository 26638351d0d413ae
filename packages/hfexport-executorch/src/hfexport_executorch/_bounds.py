"""The upper bounds ExecuTorch plans memory for: one per dynamic dim of the traced program.

ExecuTorch plans every activation at the upper bounds of its dynamic dims, and the runtime allocates that plan
when it loads the program, so the bounds decide the memory a ``dynamic=True`` export costs. The dims of the
model's known inputs get the bound of their role (``hfexport_dynamo.inputs.dim_roles``):

* ``batch`` (dim 0 of ``input_ids``, ``attention_mask``, ``pixel_values``, ...): ``ExecutorchConfig.max_batch``,
  else :data:`DEFAULT_MAX_BATCH`;
* ``sequence`` / ``decoder_sequence`` (dim 1 of the token inputs): ``max_seq_len``, else the model config's
  ``max_position_embeddings`` (``n_positions``; ``max_target_positions`` for a decoder), else ``dim_upper_bound``;

and never above a bound torch.export inferred (512 positions in a BERT). Any other dim torch.export left
unbounded gets ``dim_upper_bound``. Explicit ``Dim(max=...)`` bounds of the user's ``dynamic_shapes`` are kept
unless ``max_batch``/``max_seq_len`` are given. Nothing here imports executorch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from hfexport.plugin import ExportContext
from hfexport_dynamo.inputs import dim_roles, max_positions

from ._graph import shape_envs

__all__ = ["DEFAULT_MAX_BATCH", "DimBounds", "bound_dynamic_dims"]

# The largest batch planned for when ``max_batch`` is not given: all-MiniLM-L6-v2 with dynamic=True (sequence
# <= 512 from its config) plans about 0.3 GiB at 8, 2.8 GiB at 64.
DEFAULT_MAX_BATCH = 8


@dataclass
class DimBounds:
    """What :func:`bound_dynamic_dims` chose.

    Attributes:
        roles: role -> ``{"max": int, "source": str, "symbols": [str]}``: the bound of each role's dims and where
            it comes from (``"max_batch"``, ``"default max_batch"``, ``"config.max_position_embeddings"``,
            ``"max_seq_len"``, ``"dim_upper_bound"``, ``"torch.export"`` when the model's own bound was lower).
        bounded: symbol -> ``(min, max)`` for every range that was changed.
    """

    roles: dict[str, dict[str, Any]] = field(default_factory=dict)
    bounded: dict[str, tuple[int, int]] = field(default_factory=dict)

    def summary(self) -> str:
        """``batch <= 8 (default max_batch), sequence <= 512 (config.max_position_embeddings)``."""
        return ", ".join(f"{role} <= {info['max']} ({info['source']})" for role, info in self.roles.items())


def _role_bound(role: str, config: Any, model: Any) -> tuple[int, str]:
    if role == "batch":
        return (config.max_batch, "max_batch") if config.max_batch else (DEFAULT_MAX_BATCH, "default max_batch")
    if config.max_seq_len:
        return config.max_seq_len, "max_seq_len"
    limit = max_positions(model, role)
    return (limit[0], f"config.{limit[1]}") if limit else (config.dim_upper_bound, "dim_upper_bound")


def _input_symbols(program: torch.export.ExportedProgram, inputs: dict[str, Any]) -> dict[tuple[str, int], Any]:
    """``(input name, dim) -> sympy symbol`` for the dynamic dims of the program's top-level tensor inputs."""
    placeholders = {n.name: n for n in program.graph.nodes if n.op == "placeholder"}
    out = {}
    for spec in program.graph_signature.input_specs:
        name = getattr(spec.arg, "name", None)
        if spec.kind.name != "USER_INPUT" or name not in inputs or name not in placeholders:
            continue
        val = placeholders[name].meta.get("val")
        for dim, size in enumerate(getattr(val, "shape", ())):
            if isinstance(size, torch.SymInt) and size.node.expr.is_symbol:
                out[(name, dim)] = size.node.expr
    return out


def bound_dynamic_dims(program: torch.export.ExportedProgram, ctx: ExportContext) -> DimBounds:
    """Narrow the ranges of ``program``'s dynamic dims (``range_constraints`` and the ShapeEnvs that
    ``meta["val"]`` points to, which ExecuTorch reads) to the bounds of the module docstring, in place.

    Raises:
        ValueError: a ``max_batch``/``max_seq_len`` below the size of the example inputs along that dim.
    """
    from torch.utils._sympy.numbers import int_oo
    from torch.utils._sympy.value_ranges import ValueRanges

    config, inputs = ctx.config, ctx.inputs
    explicit = set(config.dynamic_shapes or {})  # type: ignore[attr-defined]
    roles = dim_roles(inputs)
    wanted: dict[Any, tuple[int, str, str]] = {}  # symbol -> (bound, source, role)
    for (name, dim), symbol in _input_symbols(program, inputs).items():
        role = roles.get((name, dim))
        if role is None:
            continue
        bound, source = _role_bound(role, config, ctx.model)
        if name in explicit and source not in ("max_batch", "max_seq_len"):
            continue  # the user's Dim decides
        size = int(inputs[name].shape[dim])
        if bound < size:
            option = source.removeprefix("default ")
            raise ValueError(f"{option}={bound} is below the example inputs' {role} ({name!r} dim {dim} has size "
                             f"{size}): trace with inputs of at most {bound} there, or raise {option}")
        if symbol not in wanted or bound < wanted[symbol][0]:
            wanted[symbol] = (bound, source, role)

    def finite(value: Any) -> bool:
        return value is not int_oo and value is not -int_oo and getattr(value, "is_finite", True)

    result = DimBounds()
    for table in [program.range_constraints] + [env.var_to_range for env in shape_envs(program)]:
        for symbol, rng in list(table.items()):
            bound, source, role = wanted.get(symbol, (config.dim_upper_bound, "dim_upper_bound", None))
            if role is None and finite(rng.upper):
                continue  # no role: only unbounded dims get dim_upper_bound
            lower = int(rng.lower) if finite(rng.lower) else 0
            if finite(rng.upper) and int(rng.upper) <= bound:
                if int(rng.upper) < bound:
                    bound, source = int(rng.upper), "torch.export"  # the model's own bound is lower
            else:
                table[symbol] = ValueRanges(min(lower, bound), bound)
                result.bounded[str(symbol)] = (min(lower, bound), bound)
            if role is not None and table is program.range_constraints:
                info = result.roles.setdefault(role, {"max": bound, "source": source, "symbols": []})
                if bound > info["max"]:
                    info.update(max=bound, source=source)
                info["symbols"].append(str(symbol))
    return result
