"""The memory a program plans at the upper bounds of its dynamic dims, estimated before lowering, and default
bounds lowered until it fits a budget.

ExecuTorch plans every activation at the upper bounds of the dynamic dims and the runtime allocates the plan when it
loads the program (``_bounds.py``). Defaults that fit real inputs can still plan far too much: 30 s of audio at a
batch of 16 (Transformers' Wav2Vec2 tester, its batch of 13 grown) plans 16 GiB, most of it the attention scores
over the frames. :func:`fit_default_bounds` estimates the plan from the traced program alone (no lowering: each
node's output size at the bounds, alive from the node to its last user, as ExecuTorch's greedy planner keeps it)
and halves the default bound whose halving lowers the estimate most, never below the example inputs, until the
estimate fits :data:`DEFAULT_MEMORY_BUDGET_BYTES` (``ExecutorchConfig.memory_budget_gib``). A bound the user set is
never changed. After lowering, :func:`over_budget` checks the real plan: over the budget, the exporter lowers
again with the default bounds halved, or refuses a plan that the user's bounds cause, naming the dim and the
option that lowers it. Nothing here imports executorch.
"""

from __future__ import annotations

import functools
import logging
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.utils._pytree as pytree

from ._graph import shape_envs

__all__ = ["DEFAULT_MEMORY_BUDGET_BYTES", "BudgetChoice", "estimate_planned_bytes", "fit_default_bounds",
           "fit_memory_budget", "lower_within_budget", "narrow_bounds", "option_for_role"]

logger = logging.getLogger("hfexport")

DEFAULT_MEMORY_BUDGET_BYTES = 2 << 30
"""The most memory (2 GiB) a program may plan at the bounds of its dynamic dims (``ExecutorchConfig.memory_budget_gib``
overrides it)."""
_MAX_LOWERINGS = 3  # the first, then at most two more with default bounds halved after the real plan

_USER_SOURCES = ("max_batch", "max_seq_len", "dim_upper_bound")
_OPTION = {"batch": "max_batch", "sequence": "max_seq_len", "decoder_sequence": "max_seq_len", "audio": "max_seq_len",
           "frames": "max_seq_len"}
# ops whose output is a view of an input in the ExecuTorch program (no planned buffer of its own)
_VIEWS = {"view", "_unsafe_view", "reshape", "expand", "alias", "detach", "squeeze", "unsqueeze", "select", "slice",
          "t", "transpose", "permute", "as_strided", "unflatten", "flatten", "view_as", "lift_fresh_copy"}


def option_for_role(role: str) -> str:
    """The ``ExecutorchConfig`` option that bounds a dim of ``role`` (``"max_batch"``, ``"max_seq_len"``), or the
    advice for a role without one."""
    return _OPTION.get(role, "an explicit Dim(name, max=...) in dynamic_shapes")


def _is_view(node: torch.fx.Node) -> bool:
    name = getattr(getattr(node.target, "_schema", None), "name", "") or getattr(node.target, "__name__", "")
    return name.split("::")[-1].split(".")[0].rstrip("_") in _VIEWS


def _byte_terms(val: Any) -> list[tuple[Any, int]]:
    """``(numel as a sympy expression or int, itemsize)`` of each tensor leaf of a node's value."""
    terms = []
    for leaf in pytree.tree_leaves(val):
        if isinstance(leaf, torch.Tensor):
            numel: Any = 1
            for dim in leaf.shape:
                numel = numel * _expr(dim)
            terms.append((numel, leaf.dtype.itemsize))
    return terms


def _evaluate(terms: list[tuple[Any, int]], sizes: dict[Any, int], memo: dict[Any, int]) -> int:
    total = 0
    for numel, itemsize in terms:
        if not isinstance(numel, int):
            if numel not in memo:
                try:
                    memo[numel] = int(numel.xreplace({s: sizes.get(s, 1) for s in numel.free_symbols}))
                except (TypeError, ValueError):
                    memo[numel] = 0  # an expression sympy cannot evaluate: not counted
            numel = memo[numel]
        total += max(numel, 0) * itemsize
    return total


def _lifetimes(program: torch.export.ExportedProgram) -> list[tuple[int, int, list[tuple[Any, int]]]]:
    """``(first node index, last node index, byte terms)`` of every planned value: user inputs and node outputs
    (constants are not planned; a view shares its input's bytes and keeps them alive until its own last use)."""
    constants = {spec.arg.name for spec in program.graph_signature.input_specs
                 if spec.kind.name != "USER_INPUT" and hasattr(spec.arg, "name")}
    nodes = list(program.graph.nodes)
    last_use: dict[torch.fx.Node, int] = {}
    for index, node in enumerate(nodes):
        for arg in node.all_input_nodes:
            last_use[arg] = index
    owner: dict[torch.fx.Node, torch.fx.Node] = {}
    end: dict[torch.fx.Node, int] = {}
    start: dict[torch.fx.Node, int] = {}
    for index, node in enumerate(nodes):
        if node.op == "output" or (node.op == "placeholder" and node.name in constants):
            continue
        if _is_view(node) and node.all_input_nodes and node.all_input_nodes[0] in start:
            base = owner[node] = owner.get(node.all_input_nodes[0], node.all_input_nodes[0])
            end[base] = max(end[base], last_use.get(node, index))
            continue
        start[node], end[node] = index, last_use.get(node, len(nodes))
    lifetimes = [(start[n], end[n], _byte_terms(n.meta.get("val"))) for n in start]
    # attention's scores: once decomposed, [..., Lq, Lk] scores and their softmax are alive at once (Transformers'
    # Wav2Vec2 tester at batch 16 x 64,000 samples plans 290 MiB; 250 estimated with both, 144 with neither)
    for index, node in enumerate(nodes):
        if "scaled_dot_product" in str(node.target) and len(node.args) >= 2:
            query, key = (getattr(a, "meta", {}).get("val") for a in node.args[:2])
            if isinstance(query, torch.Tensor) and isinstance(key, torch.Tensor) and query.dim() >= 2:
                numel: Any = _expr(key.shape[-2])
                for dim in query.shape[:-1]:
                    numel = numel * _expr(dim)
                lifetimes.append((index, index, [(numel, query.dtype.itemsize)] * 2))
    return lifetimes


def _expr(value: Any) -> Any:
    """A SymInt's sympy expression, an int as it is."""
    return value.node.expr if isinstance(value, torch.SymInt) else int(value)


def estimate_planned_bytes(program: torch.export.ExportedProgram, sizes: dict[Any, int],
                           lifetimes: list[tuple[int, int, list[tuple[Any, int]]]] | None = None) -> int:
    """The peak bytes of the program's user inputs and activations alive at once, each at ``sizes`` (sympy symbol
    -> size; other symbols count 1), in the graph's order; constants (weights, buffers) are not counted, and views
    share their input's bytes. An estimate of what ExecuTorch's memory planning gives before any op is delegated
    (XNNPACK allocates its own workspace for delegated ops at run time instead). ``lifetimes``: the program's
    :func:`_lifetimes`, when the caller estimates several times."""
    events: dict[int, int] = {}
    memo: dict[Any, int] = {}  # expression -> its value at sizes: few shapes, many nodes
    for first, last, terms in lifetimes if lifetimes is not None else _lifetimes(program):
        size = _evaluate(terms, sizes, memo)
        events[2 * first + 1] = events.get(2 * first + 1, 0) + size  # allocated at its node
        events[2 * last + 2] = events.get(2 * last + 2, 0) - size  # freed after its last user
    live = peak = 0
    for key in sorted(events):
        live += events[key]
        peak = max(peak, live)
    return peak


def _symbol_sizes(program: torch.export.ExportedProgram) -> tuple[dict[Any, int], dict[Any, int]]:
    """``(upper bound, example size)`` of every symbol the program's ranges bound. ``sys.maxsize - 1``, the "no
    upper bound" of a size-like unbacked symbol (a boolean index over a dynamic batch and sequence), is no bound:
    counted there, one such size was estimated at 2**65 bytes and every default bound was halved to its floor
    (Molmo2's batch to 9, below the sweep's second shape)."""
    upper: dict[Any, int] = {}
    for symbol, rng in program.range_constraints.items():
        try:
            upper[symbol] = int(rng.upper)
        except (TypeError, ValueError, OverflowError, AttributeError):  # int(int_oo) is an AttributeError
            continue
        if upper[symbol] >= sys.maxsize - 1:
            del upper[symbol]
    hints: dict[Any, int] = {}
    for env in shape_envs(program):
        values = env.backed_var_to_val if hasattr(env, "backed_var_to_val") else env.var_to_val
        for symbol, value in values.items():
            if getattr(value, "is_number", False) or isinstance(value, int):
                hints.setdefault(symbol, int(value))
    return upper, hints


def narrow_bounds(program: torch.export.ExportedProgram, new: dict[str, int]) -> None:
    """Lower the upper bounds of the symbols named in ``new`` (``str(symbol) -> bound``) in ``range_constraints``
    and the ShapeEnvs, in place (what ``_bounds.bound_dynamic_dims`` wrote, narrowed)."""
    from torch.utils._sympy.value_ranges import ValueRanges

    for table in [program.range_constraints] + [env.var_to_range for env in shape_envs(program)]:
        for symbol, rng in list(table.items()):
            if str(symbol) in new:
                bound = new[str(symbol)]
                table[symbol] = ValueRanges(min(int(rng.lower), bound), bound)


@dataclass
class BudgetChoice:
    """What :func:`fit_default_bounds` did.

    Attributes:
        estimate_before: the estimate (bytes) at the bounds ``_bounds.py`` chose.
        estimate_after: the estimate at the bounds kept.
        lowered: role -> ``(old bound, new bound)`` for every default bound halved.
        cause: the role whose bound drives the estimate most (halving it lowers the estimate most); None when
            no role has a dynamic dim.
    """

    estimate_before: int
    estimate_after: int
    lowered: dict[str, tuple[int, int]]
    cause: str | None


def fit_default_bounds(program: torch.export.ExportedProgram, bounds: Any, budget: float, *,
                       measure: Callable[[dict[Any, int]], int] | None = None,
                       floors: dict[str, int] | None = None) -> BudgetChoice:
    """Halve default bounds of ``bounds`` (a ``_bounds.DimBounds``, updated in place with the program's ranges)
    until ``measure`` (default: :func:`estimate_planned_bytes` of ``program``) fits ``budget``: each time the
    default whose halving lowers it most, never below the example inputs' size (or ``floors[role]`` when larger:
    a size the caller knows the program must take). Bounds the user set (``max_batch``, ``max_seq_len``,
    ``dim_upper_bound``) are kept; a bound torch.export inferred from the model is a default here.
    """
    upper, hints = _symbol_sizes(program)
    if measure is None:
        lifetimes = _lifetimes(program)
        measure = lambda sizes: estimate_planned_bytes(program, sizes, lifetimes)  # noqa: E731
    symbols = {role: [s for s in upper if str(s) in info["symbols"]] for role, info in bounds.roles.items()}
    floor = {role: max([hints.get(s, 1) for s in syms] + [(floors or {}).get(role, 1)])
             for role, syms in symbols.items()}
    sizes = dict(upper)
    before = estimate = measure(sizes)

    def trial(role: str) -> tuple[int, dict[Any, int]]:
        bound = bounds.roles[role]["max"]
        new = max(bound // 2, floor[role])
        candidate = {**sizes, **{s: min(sizes[s], new) for s in symbols[role]}}
        return measure(candidate), candidate

    cause = None
    if bounds.roles:  # the role that drives the estimate: halving it gains most (any source)
        gains = {role: trial(role)[0] for role in bounds.roles if symbols[role]}
        cause = min(gains, key=gains.get) if gains else None
    lowered: dict[str, tuple[int, int]] = {}
    while estimate > budget:
        options = {}
        for role, info in bounds.roles.items():
            # a bound torch.export inferred (the model's own, e.g. ProphetNet's 510 positions) may go lower too:
            # a program is valid on any part of its range, and keeping it would leave only the batch to halve
            if info["source"] in _USER_SOURCES or not symbols[role]:
                continue
            if max(info["max"] // 2, floor[role]) < info["max"]:
                options[role] = trial(role)
        if not options:
            break
        role = min(options, key=lambda r: (options[r][0], -bounds.roles[r]["max"]))
        estimate, sizes = options[role]
        old = lowered.get(role, (bounds.roles[role]["max"], 0))[0]
        new = max(bounds.roles[role]["max"] // 2, floor[role])
        lowered[role] = (old, new)
        source = bounds.roles[role]["source"]
        if ", halved to fit " not in source:
            source += f", halved to fit {budget / 2**30:g} GiB"
        bounds.roles[role].update(max=new, source=source)
    if lowered:
        narrow = {str(s): sizes[s] for role in lowered for s in symbols[role]}
        narrow_bounds(program, narrow)
        for name, bound in narrow.items():
            bounds.bounded[name] = (bounds.bounded.get(name, (0, bound))[0], bound)
    return BudgetChoice(before, estimate, lowered, cause)


def _budget_bytes(ctx: Any) -> int | None:
    gib = getattr(ctx.config, "memory_budget_gib", DEFAULT_MEMORY_BUDGET_BYTES / 2**30)
    return None if gib is None else int(gib * 2**30)


def _record(bounds: Any, choice: BudgetChoice, budget: int, what: str, ctx: Any) -> None:
    """Log and note the default bounds halved, and keep them in ``bounds.budget`` (the manifest's
    ``executorch.memory_budget``)."""
    info = bounds.budget or {"budget_bytes": budget, "estimated_bytes": choice.estimate_before, "lowered": {}}
    for role, (old, new) in choice.lowered.items():
        first = info["lowered"].get(role, [old, new])[0]
        info["lowered"][role] = [first, new]
    info.update(cause=choice.cause, estimated_bytes_after=choice.estimate_after)
    bounds.budget = info
    if not choice.lowered:
        return
    halved = ", ".join(f"{role} <= {new} (was {old}; {option_for_role(role)} sets it)"
                       for role, (old, new) in choice.lowered.items())
    message = (f"ExecuTorch: {what} {choice.estimate_before / 2**30:.1f} GiB at the default bounds of the dynamic "
               f"dims, over the {budget / 2**30:g} GiB budget (ExecutorchConfig.memory_budget_gib), most of it for "
               f"{choice.cause}: lowered {halved}; about {choice.estimate_after / 2**30:.2f} GiB now. Larger inputs "
               "are refused: set the option above to keep a larger bound")
    ctx.note(message)
    logger.warning(message)


def fit_memory_budget(program: torch.export.ExportedProgram, ctx: Any, bounds: Any) -> None:
    """Before lowering: halve the default bounds of ``bounds`` (a ``_bounds.DimBounds``) until the estimated plan
    fits the budget (:func:`fit_default_bounds`), logging and recording what was chosen. A no-op without a budget
    or dynamic dims with a role."""
    budget = _budget_bytes(ctx)
    if budget is None or not bounds.roles:
        return
    _record(bounds, fit_default_bounds(program, bounds, budget), budget, "the program would plan about", ctx)


def lower_within_budget(ctx: Any, program: torch.export.ExportedProgram, bounds: Any, lower: Callable[[], Any],
                        planned_of: Callable[[Any], int]) -> tuple[Any, int]:
    """``(lower(), planned bytes)`` once the real plan fits the budget: while it does not and default bounds can go
    lower, the defaults are halved again (the estimate scaled to the real plan) and the program lowered again (at
    most :data:`_MAX_LOWERINGS` lowerings in all).

    Raises:
        ValueError: the plan exceeds the budget and the bound that drives it is the user's (``max_batch``,
            ``max_seq_len``, ``dim_upper_bound``): the message names the dim, the option and the budget option.
    """
    result = lower()
    planned, budget = planned_of(result), _budget_bytes(ctx)
    if budget is None or not bounds.roles:
        return result, planned
    for _ in range(_MAX_LOWERINGS - 1):
        if planned <= budget:
            return result, planned
        lifetimes = _lifetimes(program)
        upper, _ = _symbol_sizes(program)
        scale = planned / max(1, estimate_planned_bytes(program, upper, lifetimes))
        choice = fit_default_bounds(program, bounds, budget, measure=functools.partial(
            _scaled_estimate, program, lifetimes, scale))
        choice.estimate_before = planned
        if not choice.lowered:
            break
        _record(bounds, choice, budget, "the lowered program plans", ctx)
        result = lower()
        planned = planned_of(result)
    if planned > budget:
        _refuse_if_the_users(planned, budget, bounds, program)
    return result, planned


def _scaled_estimate(program: torch.export.ExportedProgram, lifetimes: Any, scale: float, sizes: dict[Any, int]) -> int:
    return int(scale * estimate_planned_bytes(program, sizes, lifetimes))


def _refuse_if_the_users(planned: int, budget: int, bounds: Any, program: torch.export.ExportedProgram) -> None:
    role = fit_default_bounds(program, bounds, float("inf")).cause  # nothing lowered: only the cause
    if role is None or bounds.roles[role]["source"] not in _USER_SOURCES:
        return  # the default bounds are as low as the example allows: the warning of report_planned_memory says so
    info = bounds.roles[role]
    raise ValueError(
        f"ExecuTorch plans {planned / 2**30:.1f} GiB for the upper bounds of the dynamic dims, over the "
        f"{budget / 2**30:g} GiB budget, most of it for {role} <= {info['max']} (your {info['source']}): lower "
        f"{info['source']} (the memory grows with it, quadratically through attention), or raise "
        "ExecutorchConfig(memory_budget_gib=...) (None: no budget) if the target has the memory")

