"""The upper bounds ExecuTorch plans memory for: one per dynamic dim of the traced program.

ExecuTorch plans every activation at the upper bounds of its dynamic dims, and the runtime allocates that plan
when it loads the program, so the bounds decide the memory a ``dynamic=True`` export costs. The dims of the
model's known inputs get the bound of their role (``hfexport_dynamo.inputs.dim_roles``):

* ``batch`` (dim 0 of ``input_ids``, ``attention_mask``, ``pixel_values``, ...): ``ExecutorchConfig.max_batch``,
  else :data:`DEFAULT_MAX_BATCH` grown to the example's batch (rounded up to a power of two);
* ``sequence`` / ``decoder_sequence`` (dim 1 of the token inputs): ``max_seq_len``, else the model config's
  ``max_position_embeddings`` (``n_positions``; ``max_target_positions`` for a decoder), else ``dim_upper_bound``;
* ``audio`` (raw samples) and ``frames`` (feature frames): ``max_seq_len``, else 30 s of audio
  (``hfexport_dynamo.inputs.typical_size``: at ``config.sampling_rate`` or 16 kHz; Whisper's 3,000 frames);
* ``image_height`` / ``image_width``: twice the example's size, or ``config.image_size`` if larger;

and never above a bound torch.export inferred (512 positions in a BERT). Any other dim torch.export left
unbounded gets ``dim_upper_bound``. A default bound is never below the example inputs: it grows to the example's
size rounded up to a power of two (a batch of 13 gets 16); a bound the user set below them is refused, and the
message says it was the user's. Explicit ``Dim(max=...)`` bounds of the user's ``dynamic_shapes`` are kept
unless ``max_batch``/``max_seq_len`` are given. Nothing here imports executorch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from hfexport.plugin import ExportContext
from hfexport_dynamo.inputs import dim_roles, typical_size

from ._graph import shape_envs

__all__ = ["DEFAULT_DIM_UPPER_BOUND", "DEFAULT_MAX_BATCH", "DimBounds", "bound_dynamic_dims"]

# The largest batch planned for when ``max_batch`` is not given and the example's batch is smaller:
# all-MiniLM-L6-v2 with dynamic=True (sequence <= 512 from its config) plans about 0.3 GiB at 8, 2.8 GiB at 64.
DEFAULT_MAX_BATCH = 8
# The largest size given to a dynamic dimension that torch.export left unbounded (``Dim.AUTO``, ``Dim.DYNAMIC``)
# and that has no role with a config size (a sequence without a position limit, a dim of an unknown input), when
# ``dim_upper_bound`` is not given and the example is smaller. ExecuTorch plans memory for the upper bound of
# every dynamic dim, so planned activations grow with the product of the bounds (attention scores with
# batch * seq * seq), and the runtime allocates that memory when it loads the program.
DEFAULT_DIM_UPPER_BOUND = 64
_SEQUENCES = ("sequence", "decoder_sequence", "audio", "frames")
_USER_OPTIONS = ("max_batch", "max_seq_len", "dim_upper_bound")


@dataclass
class DimBounds:
    """What :func:`bound_dynamic_dims` chose.

    Attributes:
        roles: role -> ``{"max": int, "source": str, "symbols": [str]}``: the bound of each role's dims and where
            it comes from (the user's ``"max_batch"``, ``"max_seq_len"``, ``"dim_upper_bound"``; a default:
            ``"default max_batch"``, ``"default dim_upper_bound"``, either with ``", grown to the example"``;
            the config: ``"config.max_position_embeddings"``, ``"config.image_size"``, ``"2 x the example"``,
            ``"30 s at 16 kHz"``; ``"torch.export"`` when the model's own bound was lower).
        bounded: symbol -> ``(min, max)`` for every range that was changed.
        budget: what fitting the memory budget did (``_memory_plan.py``): ``budget_bytes``, ``estimated_bytes``
            (at the bounds chosen here), ``estimated_bytes_after``, ``cause`` (the role that drives the plan) and
            ``lowered`` (role -> ``[old, new]`` for each default bound halved); None without a budget.
    """

    roles: dict[str, dict[str, Any]] = field(default_factory=dict)
    bounded: dict[str, tuple[int, int]] = field(default_factory=dict)
    budget: dict[str, Any] | None = None

    def summary(self) -> str:
        """``batch <= 8 (default max_batch), sequence <= 512 (config.max_position_embeddings)``."""
        return ", ".join(f"{role} <= {info['max']} ({info['source']})" for role, info in self.roles.items())

    def user_given(self) -> bool:
        """Whether every role's bound is one the user set."""
        return bool(self.roles) and all(info["source"] in _USER_OPTIONS for info in self.roles.values())


def _round_up(size: int) -> int:
    """The smallest power of two >= ``size``."""
    return 1 << max(0, int(size) - 1).bit_length()


def _grown(bound: int, source: str, size: int) -> tuple[int, str]:
    """A default ``bound`` raised to ``size`` rounded up to a power of two when ``size`` exceeds it."""
    return (bound, source) if size <= bound else (_round_up(size), f"{source}, grown to the example")


def _role_bound(role: str, config: Any, model: Any, size: int) -> tuple[int, str]:
    """``(bound, source)`` of a dim of ``role`` whose example has ``size``; a user's bound is returned as given
    (the caller refuses it when below ``size``), a default is never below ``size``."""
    if role == "batch":
        return (config.max_batch, "max_batch") if config.max_batch else \
            _grown(DEFAULT_MAX_BATCH, "default max_batch", size)
    if role in _SEQUENCES and config.max_seq_len:
        return config.max_seq_len, "max_seq_len"
    typical = typical_size(model, role)
    if role in ("image_height", "image_width"):
        doubled = 2 * size
        return (typical[0], typical[1]) if typical and typical[0] > doubled else (doubled, "2 x the example")
    if typical is not None and typical[0] >= size:
        return typical
    return _other_bound(config, size)


def _other_bound(config: Any, size: int) -> tuple[int, str]:
    """The bound of a dim with no role (or no config size): the user's ``dim_upper_bound`` as given, else the
    default grown to ``size``."""
    if config.dim_upper_bound is not None:
        return config.dim_upper_bound, "dim_upper_bound"
    return _grown(DEFAULT_DIM_UPPER_BOUND, "default dim_upper_bound", size)


def _refuse_below(source: str, bound: int, what: str, size: int) -> None:
    raise ValueError(f"{source}={bound} (your ExecutorchConfig setting) is below the example inputs' {what} "
                     f"(size {size}): trace with inputs of at most {bound} there, or raise {source} (or leave it "
                     "unset: the default grows to the example)")


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
        ValueError: a ``max_batch``/``max_seq_len``/``dim_upper_bound`` the user set below the size of the example
            inputs along a dim it bounds (the message names the setting as the user's).
    """
    from torch.utils._sympy.numbers import int_oo
    from torch.utils._sympy.value_ranges import ValueRanges

    config, inputs = ctx.config, ctx.inputs
    explicit = set(config.dynamic_shapes or {})  # type: ignore[attr-defined]
    roles = dim_roles(inputs, ctx.model)
    wanted: dict[Any, tuple[int, str, str]] = {}  # symbol -> (bound, source, role)
    for (name, dim), symbol in _input_symbols(program, inputs).items():
        role = roles.get((name, dim))
        if role is None:
            continue
        size = int(inputs[name].shape[dim])
        bound, source = _role_bound(role, config, ctx.model, size)
        if name in explicit and source not in _USER_OPTIONS:
            continue  # the user's Dim decides
        if bound < size:
            _refuse_below(source, bound, f"{role} ({name!r} dim {dim})", size)
        if symbol not in wanted or bound < wanted[symbol][0]:
            wanted[symbol] = (bound, source, role)

    def finite(value: Any) -> bool:
        return value is not int_oo and value is not -int_oo and getattr(value, "is_finite", True)

    hints: dict[Any, int] = {}  # symbol -> its size in the example inputs
    for env in shape_envs(program):
        values = env.backed_var_to_val if hasattr(env, "backed_var_to_val") else env.var_to_val  # torch < 2.15
        for symbol, value in values.items():
            if getattr(value, "is_number", False) or isinstance(value, int):
                hints.setdefault(symbol, int(value))

    result = DimBounds()
    declared: dict[Any, int] = {}  # symbol -> the bound given in range_constraints, the program's own ranges
    for table in [program.range_constraints] + [env.var_to_range for env in shape_envs(program)]:
        for symbol, rng in list(table.items()):
            if table is not program.range_constraints and symbol in declared and symbol in wanted:
                # A ShapeEnv can keep a range tighter than the program's (a size-oblivious retrace widened the
                # program's range, hfexport_dynamo's _widen_narrowed_dims, and left the trace's [0, 32] in the
                # ShapeEnv): ExecuTorch plans from the ShapeEnv, so it gets the program's bound
                if not (finite(rng.upper) and int(rng.upper) == declared[symbol]):
                    table[symbol] = ValueRanges(min(int(rng.lower) if finite(rng.lower) else 0, declared[symbol]),
                                                declared[symbol])
                continue
            if symbol in wanted:
                bound, source, role = wanted[symbol]
            else:
                role = None
                if finite(rng.upper):
                    continue  # no role: only unbounded dims get dim_upper_bound
                bound, source = _other_bound(config, hints.get(symbol, 0))
                if bound < hints.get(symbol, 0):
                    _refuse_below(source, bound, f"size of the dynamic dim {symbol}", hints[symbol])
            lower = int(rng.lower) if finite(rng.lower) else 0
            if finite(rng.upper) and int(rng.upper) <= bound:
                if int(rng.upper) < bound:
                    bound, source = int(rng.upper), "torch.export"  # the model's own bound is lower
            else:
                table[symbol] = ValueRanges(min(lower, bound), bound)
                result.bounded[str(symbol)] = (min(lower, bound), bound)
            if table is program.range_constraints:
                declared[symbol] = bound
            if role is not None and table is program.range_constraints:
                info = result.roles.setdefault(role, {"max": bound, "source": source, "symbols": []})
                if bound > info["max"]:
                    info.update(max=bound, source=source)
                info["symbols"].append(str(symbol))
    return result
