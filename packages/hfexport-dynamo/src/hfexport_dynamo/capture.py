"""Capture: a model and its example inputs to a ``torch.export`` ``ExportedProgram``, the first step of every export.

The kernel's pipeline calls :func:`capture` (through ``DYNAMO_TRACER.capture``) between a backend's ``prepare`` and
``lower``. It runs the five documented dynamo stages, each marked below by its ``# ── Stage N: Title ──`` banner,
then the step ``torch.export.export`` (``export_step.py``: one batch and one sequence symbol across the token
inputs, and the retraces that widen a range torch.export narrowed):

1. Forward signature patch — a flat, explicit signature from the sample inputs (internal); Python constants and
   a vision-language processor's integer layout inputs (``image_grid_thw``, ``image_sizes``: see
   :data:`hfexport_dynamo.inputs.IMAGE_LAYOUT_INPUTS`) are baked in.
2. Model patches — ``@register_patch("dynamo", ...)``.
3. Pytree registration — every ``Cache`` and ``ModelOutput`` flattens and rebuilds.
4. Dynamic shapes — ``Dim.AUTO`` on every tensor and cache leaf when ``dynamic=True`` (but the image dims of a
   ``pixel_values`` that comes with text: :func:`hfexport_dynamo.inputs.static_image_dims`); overridden by
   ``DynamoConfig.dynamic_shapes``.
5. State cleanup — tensor attributes a model sets inside ``forward`` (``_STATEFUL_CACHE_ATTRS``) are nulled for the
   trace and restored after it.
"""

from __future__ import annotations

import contextlib
import copy
import inspect
import logging
import warnings
from collections.abc import Iterator, Mapping
from typing import Any

import torch
import torch.utils._pytree as pytree
from torch.export import Dim

from hfexport.plugin import ExportContext, Stage

from . import (  # the workarounds of stage 2 (Model patches) and of the backends' FX node fixes, registered on import
    _associative_scan,  # noqa: F401  associative_scan as a scan op
    _common_patches,  # noqa: F401  torch ops and transformers' shared code
    _fake_quant,  # noqa: F401  fake-quant modules and ops of QAT models
    _linear_attention_patches,  # noqa: F401  linear-attention layers in text generation (installed by the step)
    _media_patches,  # noqa: F401  media dims: images per call, image sizes
    _model_patches,  # noqa: F401  single model families
    _recurrences,  # noqa: F401  scan ops of recurrent models
    _rnn_layers,  # noqa: F401  nn.RNN/GRU/LSTM as scan ops
    _while_loop,  # noqa: F401  while_loop as masked iterations (while_loop_max_iterations)
    _window_padding,  # noqa: F401  shifted-window padding
    rewrites,  # noqa: F401  _fix_complex_to_real_pairs, for the backends without complex tensors
)
from ._config import trace_state
from ._pytree import register_transformers_pytrees
from .export_step import export_with_shared_dims, warn_specialized
from .inputs import IMAGE_LAYOUT_INPUTS, IMAGE_SIZE_LISTS, forward_parameters, shared_dims, static_image_dims

logger = logging.getLogger("hfexport")

__all__ = ["CAPTURE_STAGES", "IGNORED_KWARGS", "KWARG_ALIASES", "capture"]

# Deprecated names transformers still accepts through **kwargs and renames inside forward (its
# ``_rename_kwargs_for_bc``): an input under such a name reaches the parameter it stands for.
KWARG_ALIASES: dict[str, str] = {"past_key_values": "cache", "cache_params": "cache"}

# Inputs current transformers ignores when they reach forward through **kwargs: transformers 5 removed head
# masks (no model of 5.24 reads ``head_mask``), but forwards with **kwargs still accept them, and Transformers' own
# model testers still pass them. An export drops them with a warning (``ignored_inputs`` in the manifest), and
# the artifact drops them again when called with them.
IGNORED_KWARGS: tuple[str, ...] = ("head_mask", "decoder_head_mask", "cross_attn_head_mask")



# The documented capture stages (the stage reference: docs/guide.md, Architecture), run by :func:`capture` for every backend;
# each is marked below by its ``# ── Stage N: Title ──`` banner.
CAPTURE_STAGES: tuple[Stage, ...] = (
    Stage(1, "Forward signature patch", "internal"),
    Stage(2, "Model patches", '@register_patch("dynamo", ...)'),
    Stage(3, "Pytree registration", "hfexport_dynamo.register_cache_type"),
    Stage(4, "Dynamic shapes", "DynamoConfig.dynamic_shapes"),
    Stage(5, "State cleanup", "_STATEFUL_CACHE_ATTRS"),
)



# Tensor attributes that some modules set inside forward (a rotary-embedding cache keyed on the last
# sequence length). Left set from an eager call, the trace would bake the stale tensor in as a constant
# and branch on a Python int; nulled, the module recomputes it inside the graph.
_STATEFUL_CACHE_ATTRS: tuple[str, ...] = (
    "cached_sequence_length",              # wav2vec2_conformer / wav2vec2_bert / seamless_m4t / clvp rotary
    "cached_rotary_positional_embedding",  # same modules: the cached cos/sin stack
    "_cached_decode_position_ids",         # glm_image: decode position ids from the prompt
)

_CACHE_INPUT_NAMES = ("cache", "past_key_values", "cache_params")


class _ExportSignature(torch.nn.Module):
    """Calls ``model(**dict(zip(names, args)), **fixed_kwargs)``; forward gets an explicit signature.

    The output goes once through ``tree_flatten``/``tree_unflatten`` before it is returned. transformers'
    ``ModelOutput`` flattens its keys in insertion order and unflattens them in field order, so a field set after
    construction (the LLaVA family's ``image_outputs.pooler_output``) made the two disagree: every re-trace of the
    program (``run_decompositions``, ``to_edge``) listed the output leaves in field order under a spec that
    says insertion order, and the artifact returned ``pooler_output`` in the slot of ``hidden_states[2]`` (Aya
    Vision, InternVL). After one round trip the order is the field order both ways. No upstream issue found.
    """

    def __init__(self, model: torch.nn.Module, names: list[str], fixed_kwargs: dict[str, Any]):
        super().__init__()
        self.model = model
        self.input_names = list(names)
        self.fixed_kwargs = dict(fixed_kwargs)

    def forward(self, *args: Any) -> Any:
        # baked image sizes go in as Python lists, which the model iterates as it iterates the tensor: read from the
        # tensor, each size would be a data-dependent symbol in the trace (LLaVA-NeXT's anyres grid, Pixtral's crops)
        fixed = {k: v.tolist() if k in IMAGE_SIZE_LISTS and isinstance(v, torch.Tensor) else v
                 for k, v in self.fixed_kwargs.items()}
        output = self.model(**dict(zip(self.input_names, args, strict=True)), **fixed)
        return pytree.tree_unflatten(*pytree.tree_flatten(output))


def _with_signature(model: torch.nn.Module, names: list[str], fixed: dict[str, Any]) -> _ExportSignature:
    """A wrapper whose ``forward(self, input_ids, attention_mask, ...)`` names the program's inputs."""
    params = [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    params += [inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD) for n in names]

    def forward(self: _ExportSignature, *args: Any) -> Any:
        return _ExportSignature.forward(self, *args)

    forward.__dict__["__signature__"] = inspect.Signature(params)  # what inspect.signature reads
    cls = type(f"{type(model).__name__}Signature", (_ExportSignature,), {"forward": forward})
    return cls(model, names, fixed)


@contextlib.contextmanager
def _nulled_state(model: torch.nn.Module, attrs: tuple[str, ...]) -> Iterator[list[str]]:
    saved = []
    for name, module in model.named_modules():
        for attr in attrs:
            if getattr(module, attr, None) is not None and attr in vars(module):
                saved.append((module, attr, vars(module)[attr], f"{name}.{attr}" if name else attr))
    try:
        for module, attr, _, _ in saved:
            setattr(module, attr, None)
        yield [where for *_, where in saved]
    finally:
        for module, attr, value, _ in saved:
            setattr(module, attr, value)


def _auto_spec(value: Any) -> Any:
    """``Dim.AUTO`` on every dim of every tensor leaf; ``None`` for non-tensor leaves."""
    if isinstance(value, torch.Tensor):
        return {i: Dim.AUTO for i in range(value.dim())} if value.dim() else None
    leaves, spec = pytree.tree_flatten(value)
    if spec.num_leaves == 1 and spec.is_leaf():
        return None
    return [_auto_spec(leaf) for leaf in leaves]



def capture(ctx: ExportContext) -> torch.export.ExportedProgram:
    """Capture ``ctx.model`` on ``ctx.inputs``: the five dynamo stages, then the step ``torch.export.export``;
    set and return ``ctx.program``. Every export runs it once, between the backend's ``prepare`` and ``lower``
    (``DYNAMO_TRACER.capture``).

    Raises:
        hfexport.ExportError: a stage or ``torch.export.export`` failed (names which; the cause is chained).
    """
    with contextlib.ExitStack() as trace_only:  # what the trace alone needs: restored right after it
        with ctx.capture_stage(1):
            forward_signature(ctx)
        with ctx.capture_stage(2):
            ctx.install_patches(("dynamo",))
            ctx.install_patches(("dynamo.trace",), until=trace_only)  # torch's own tracing: not the lowering's
            if hasattr(ctx.model, "disabled_patches"):  # a task step that installs its own patches in its forward
                ctx.model.disabled_patches = tuple(ctx.config.disable)  # (scope "dynamo.text_generation")
        with ctx.capture_stage(3):
            pytree_registration(ctx)
        with ctx.capture_stage(4):
            dynamic_shapes(ctx)
        with ctx.capture_stage(5):
            nulled = trace_only.enter_context(_nulled_state(ctx.model, _STATEFUL_CACHE_ATTRS))
            if nulled:
                ctx.note(f"nulled for the trace and restored: {', '.join(nulled)}")
        state = trace_state(ctx)

        def args() -> tuple[Any, ...]:
            return tuple(copy.deepcopy(v) if not isinstance(v, torch.Tensor) else v for v in ctx.inputs.values())

        with ctx.step("torch.export.export"):
            ctx.program = export_with_shared_dims(ctx, state.wrapper, args, strict=state.config.strict)
    warn_specialized(ctx)
    return ctx.program


# ── Stage 1: Forward signature patch ──
def forward_signature(ctx: ExportContext) -> None:
    """A flat, explicit signature for the model's forward from the sample inputs; constants baked in."""
    names, takes_kwargs = forward_parameters(ctx.model)
    unknown = [n for n in ctx.inputs if n not in names and not takes_kwargs]
    if unknown:
        raise TypeError(f"{ctx.model_class}.forward takes no {unknown}; it takes {names}")
    ignored = [n for n in ctx.inputs if n in IGNORED_KWARGS and n not in names]
    if ignored:  # reach forward only through **kwargs, where transformers ignores them
        message = (f"{ctx.model_class}: dropped input {', '.join(map(repr, ignored))}: forward takes it only "
                   f"through **kwargs and transformers {_transformers_version()} ignores it (head masks were "
                   "removed in transformers 5); it is not a program input, and calls of the export drop it too")
        warnings.warn(message, UserWarning, stacklevel=2)
        ctx.note(message)
        trace_state(ctx).ignored_inputs = ignored
        ctx.inputs = {n: v for n, v in ctx.inputs.items() if n not in ignored}
    # Python constants among the inputs (use_cache=False, return_dict=True) are not program inputs: they
    # are baked in, and ExportedModel accepts them again only with the same value.
    fixed = {n: v for n, v in ctx.inputs.items() if isinstance(v, bool | int | float | str | type(None)) or (
        n in IMAGE_LAYOUT_INPUTS and isinstance(v, torch.Tensor) and not v.is_floating_point())}
    ctx.inputs = {n: v for n, v in ctx.inputs.items() if n not in fixed}
    # transformers 5 names the cache argument `cache` (`past_key_values` is its deprecated alias).
    has_cache_input = any(n in ctx.inputs for n in _CACHE_INPUT_NAMES)
    if "use_cache" in names and "use_cache" not in ctx.inputs:
        fixed["use_cache"] = has_cache_input
    state = trace_state(ctx)
    fixed.update(state.config.fixed_kwargs or {})
    state.fixed_kwargs = fixed
    state.wrapper = _with_signature(ctx.model, list(ctx.inputs), fixed)


# ── Stage 2: Model patches ──
# ``ctx.install_patches(("dynamo",))`` in :func:`capture`; the patches are in ``_common_patches.py``,
# ``_model_patches.py``, ``_media_patches.py``, ``_window_padding.py`` and ``_recurrences.py`` (imported above).
# Those of scope ``"dynamo.trace"`` (torch's own layout queries) are restored right after ``torch.export.export``:
# the backend's lowering retraces the program without them. Those of scope ``"dynamo.text_generation"``
# (``_linear_attention_patches.py``) are installed by the text-generation step around each forward, eager runs
# included; the step gets the export's ``disable`` here.


# ── Stage 3: Pytree registration ──
def pytree_registration(ctx: ExportContext) -> None:
    """Every transformers ``Cache`` and ``ModelOutput`` flattens and rebuilds; inputs must flatten to tensors."""
    new = register_transformers_pytrees()
    if new:
        logger.debug("registered pytree nodes: %s", ", ".join(new))
    for name, value in ctx.inputs.items():
        for leaf in pytree.tree_leaves(value):
            if not isinstance(leaf, torch.Tensor | int | float | bool | type(None)):
                raise TypeError(f"input {name!r} holds a {type(leaf).__name__} that does not flatten to tensors: "
                                "register it with hfexport_dynamo.register_cache_type(cls, child_attrs=(...))")


# ── Stage 4: Dynamic shapes ──
def dynamic_shapes(ctx: ExportContext) -> None:
    """``Dim.AUTO`` on every tensor and cache leaf with ``dynamic=True``; ``DynamoConfig.dynamic_shapes`` wins."""
    overrides = dict(ctx.config.dynamic_shapes or {})
    unknown = sorted(set(overrides) - set(ctx.inputs))
    if unknown:
        raise KeyError(f"dynamic_shapes names {unknown}, which are not inputs; inputs: {list(ctx.inputs)}")
    for name, spec in overrides.items():
        value = ctx.inputs[name]
        if not isinstance(value, torch.Tensor):
            continue
        dims = [k for k in spec if isinstance(k, int)] if isinstance(spec, Mapping) else None
        if dims is not None and any(d >= value.dim() for d in dims):
            raise ValueError(f"dynamic_shapes[{name!r}] names dims {sorted(dims)}, but input {name!r} has "
                             f"{value.dim()} dims (shape {list(value.shape)}): use indices 0 to {value.dim() - 1}")
        if isinstance(spec, list | tuple) and len(spec) != value.dim():
            raise ValueError(f"dynamic_shapes[{name!r}] gives {len(spec)} dim specs, but input {name!r} has "
                             f"{value.dim()} dims (shape {list(value.shape)}): give one per dim, or a "
                             "mapping {dim index: Dim}")
    state = trace_state(ctx)
    if not ctx.config.dynamic and not overrides:
        state.dynamic_shapes = None
        return
    shapes = []
    for name, value in ctx.inputs.items():
        if name in overrides:
            shapes.append(overrides[name])
        elif ctx.config.dynamic:
            shapes.append(_auto_spec(value))
        else:
            shapes.append(None)
    for name, dims in (static_image_dims(ctx.inputs) if ctx.config.dynamic else {}).items():
        if name not in overrides:  # a vision-language model's image size is its processor's: static
            index = list(ctx.inputs).index(name)
            shapes[index] = {**shapes[index], **dims}
            ctx.note(f"{name}: dims {sorted(dims)} static (the image size of a vision-language model's "
                     "processor); the first dim stays dynamic")
    shared = shared_dims(ctx.model, ctx.inputs) if ctx.config.dynamic and not overrides else {}
    if shared:  # one batch and one sequence symbol across the token inputs; Dim.AUTO kept for a retrace
        state.auto_dynamic_shapes = tuple(shapes)
        shapes = [{**spec, **shared[name]} if name in shared else spec for name, spec in zip(ctx.inputs, shapes, strict=True)]
    state.dynamic_shapes = tuple(shapes)


# ── Stage 5: State cleanup ──
# ``_nulled_state(model, _STATEFUL_CACHE_ATTRS)`` in :func:`capture`, held until ``torch.export.export`` returns.



def _transformers_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("transformers")
    except PackageNotFoundError:  # pragma: no cover - a plain nn.Module without transformers installed
        return "(not installed)"
