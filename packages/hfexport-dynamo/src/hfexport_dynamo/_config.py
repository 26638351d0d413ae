"""The dynamo backend's config, and the typed state its stages hand on within one export.

:class:`DynamoConfig` is the config every backend built on the dynamo trace extends (an ``OnnxConfig`` is a
``DynamoConfig``). :class:`TraceState` is what the dynamo stages decide for one export (the baked-in forward
constants, the signature wrapper, the dynamic shapes given to ``torch.export``) and what the manifest describes
afterwards (dims specialized or relaxed, inputs dropped); it lives in ``ExportContext.trace`` and is reached with
:func:`trace_state`, also by the backends that run the dynamo stages nested under their own.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from hfexport.plugin import ExportConfig, ExportContext

__all__ = ["DynamoConfig", "TraceState", "trace_state"]


@dataclass
class DynamoConfig(ExportConfig):
    """Options of the ``dynamo`` backend.

    Attributes:
        strict: trace with TorchDynamo's strict mode (``torch.export.export(strict=True)``); the default
            non-strict mode traces Python as it runs, which Transformers models need.
        fixed_kwargs: forward keyword arguments baked into the program (not inputs), e.g.
            ``{"output_hidden_states": True}``. ``use_cache=False`` is added for models that take it,
            unless ``past_key_values`` is an input.
        while_loop_max_iterations: trace each ``while_loop`` as this many masked iterations (each runs the body
            and keeps its result only while the condition holds) instead of the ``while_loop`` op, for a runtime
            without one (ExecuTorch: pytorch/executorch#8769). A loop that would run longer stops at the bound.
    """

    strict: bool = False
    fixed_kwargs: Mapping[str, Any] | None = None
    while_loop_max_iterations: int | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        if not isinstance(self.strict, bool):
            raise TypeError(f"strict must be True or False, got {self.strict!r} ({type(self.strict).__name__})")
        if self.fixed_kwargs is not None:
            if not isinstance(self.fixed_kwargs, Mapping):
                raise TypeError(f"fixed_kwargs must map forward keyword names to constants, e.g. "
                                f"{{'output_hidden_states': True}}; got {type(self.fixed_kwargs).__name__}")
            bad = [k for k in self.fixed_kwargs if not isinstance(k, str)]
            if bad:
                raise TypeError(f"fixed_kwargs is keyed by forward keyword names (str), got keys {bad!r}")
        bound = self.while_loop_max_iterations
        if bound is not None and (not isinstance(bound, int) or isinstance(bound, bool) or bound < 1):
            raise TypeError(f"while_loop_max_iterations must be a positive int or None, got {bound!r}")
        for name, spec in (self.dynamic_shapes or {}).items():
            _check_dynamic_shape_spec(spec, f"dynamic_shapes[{name!r}]")


_DIM_SPEC_HELP = ("a dim is given a torch.export.Dim('name', min=..., max=...), Dim.AUTO, Dim.DYNAMIC, Dim.STATIC, "
                  "None or an int; a tensor's spec maps dim indices to those ({0: Dim('batch')}) or lists one per "
                  "dim, and a cache or nested input nests such specs")


def _check_dynamic_shape_spec(spec: Any, where: str) -> None:
    """Raise a TypeError naming ``where`` when ``spec`` is not a dynamic-shapes spec torch.export takes."""
    import torch.export.dynamic_shapes as ds

    dim_types = tuple(t for t in (getattr(ds, n, None) for n in ("Dim", "_Dim", "_DerivedDim", "_StaticDim", "_DimHint"))
                      if isinstance(t, type))

    def is_dim(value: Any) -> bool:
        return value is None or isinstance(value, dim_types) or (isinstance(value, int) and not isinstance(value, bool))

    if is_dim(spec):
        return
    if isinstance(spec, Mapping):
        for key, value in spec.items():
            if isinstance(key, int) and not isinstance(key, bool):
                if key < 0:
                    raise TypeError(f"{where} has dim index {key}: use non-negative dim indices ({_DIM_SPEC_HELP})")
                if not is_dim(value):
                    raise TypeError(f"{where}[{key}] is {value!r} ({type(value).__name__}); {_DIM_SPEC_HELP}")
            elif isinstance(key, str):  # a dict-like input (a mapping pytree): nested specs by key
                _check_dynamic_shape_spec(value, f"{where}[{key!r}]")
            else:
                raise TypeError(f"{where} has key {key!r} ({type(key).__name__}); {_DIM_SPEC_HELP}")
        return
    if isinstance(spec, list | tuple):
        for i, value in enumerate(spec):
            _check_dynamic_shape_spec(value, f"{where}[{i}]")
        return
    raise TypeError(f"{where} is {spec!r} ({type(spec).__name__}); {_DIM_SPEC_HELP}")


@dataclass
class TraceState:
    """What the dynamo stages decide for one export, and what the manifest then describes.

    Attributes:
        config: the export's config (the calling backend's, a :class:`DynamoConfig` or a subclass).
        fixed_kwargs: forward keyword arguments baked into the program (``use_cache=False``, the config's
            ``fixed_kwargs``, Python constants among the inputs); stage 1.
        wrapper: the module ``torch.export.export`` traces: the model with the exported signature; stage 1.
        ignored_inputs: inputs forward takes only through ``**kwargs`` and transformers ignores (head masks),
            dropped with a warning; stage 1.
        dynamic_shapes: the spec given to ``torch.export.export``, one entry per input in order (None: static);
            stage 4, widened by a retrace (relaxed named ranges, narrowed dims).
        auto_dynamic_shapes: the plain ``Dim.AUTO`` spec behind shared named dims, for a retrace without them.
        specialized_dims: dims asked to be dynamic that the trace fixed (each warned about); stage 5.
        relaxed_dims: named ``Dim`` ranges torch.export's solver refused, traced as ``Dim.DYNAMIC`` over the
            same range; stage 5.
    """

    config: DynamoConfig
    fixed_kwargs: dict[str, Any] = field(default_factory=dict)
    wrapper: Any = None
    ignored_inputs: list[str] = field(default_factory=list)
    dynamic_shapes: tuple[Any, ...] | None = None
    auto_dynamic_shapes: tuple[Any, ...] | None = None
    specialized_dims: list[dict[str, Any]] | None = None
    relaxed_dims: list[dict[str, Any]] | None = None


def trace_state(ctx: ExportContext) -> TraceState:
    """The :class:`TraceState` of the export ``ctx`` (made on first use).

    Raises:
        TypeError: the export's config is not a :class:`DynamoConfig` (a backend that traces with the dynamo
            stages must extend it).
    """
    if ctx.trace is None:
        if not isinstance(ctx.config, DynamoConfig):
            raise TypeError(f"the dynamo stages need a DynamoConfig (or a subclass), got {type(ctx.config).__name__}")
        ctx.trace = TraceState(ctx.config)
    state: TraceState = ctx.trace
    return state
