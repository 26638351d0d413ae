"""``ExecutorchConfig``: the options of the ExecuTorch backends (kept out of ``exporter_executorch.py``, which holds
the stages and steps only)."""

from __future__ import annotations

from dataclasses import dataclass

from hfexport import Quantization
from hfexport.plugin import ExportContext
from hfexport_dynamo import DynamoConfig

from ._quantize import resolve_executorch_quantization
from ._variants import backend_variants, require_executorch, variant_registration

__all__ = ["ExecutorchConfig", "executorch_config"]


@dataclass
class ExecutorchConfig(DynamoConfig):
    """Options of the ExecuTorch backends.

    Attributes:
        backend: the variant: ``"xnnpack"`` (CPU, float32, XNNPACK delegate), ``"cuda"`` (bfloat16, AOTInductor,
            needs a GPU) or one registered with :func:`register_backend_prepare`.
        alloc_graph_input: plan memory for graph inputs (the runtime copies inputs in). ``False`` only with a
            C++ caller that binds its own input buffers; the Python runtime needs ``True``.
        alloc_graph_output: plan memory for graph outputs. ``False`` only when the caller binds output buffers
            (``Method::set_output_data_ptr``).
        alloc_mutable_buffers: plan memory for buffers the graph mutates (KV caches held by the model).
        max_batch: the largest batch (dim 0 of ``input_ids``, ``attention_mask``, ``pixel_values``, ...) the
            program takes with ``dynamic=True``; ``None``: 8, or the example's batch rounded up to a power of two
            when larger (13 -> 16). ExecuTorch plans memory for it: activations grow with the product of the
            bounds, and the runtime allocates the plan when it loads the program.
        max_seq_len: the longest sequence: dim 1 of the token inputs, raw audio samples (``input_values``) and
            feature frames (``input_features``); ``None``: the config's ``max_position_embeddings``
            (``n_positions``; ``max_target_positions`` for decoder inputs) for tokens, 30 s of audio (at
            ``config.sampling_rate``, else 16 kHz; Whisper's 3,000 mel frames), else ``dim_upper_bound``. A bound
            torch.export inferred from the model is never raised.
        dim_upper_bound: the inclusive upper bound given to every other dynamic dimension torch.export left
            unbounded (and to sequences when the config names no limit); ``None``: 64, or the example's size
            rounded up to a power of two when larger. Image heights and widths get twice the example's size, or
            ``config.image_size`` when larger. Explicit ``Dim(name, max=...)`` bounds in ``dynamic_shapes`` are
            kept. A bound set here below the example inputs is refused. The bounds chosen are logged after the
            export and recorded in ``manifest["executorch"]["dim_bounds"]``, with ``planned_memory_bytes``.
        memory_budget_gib: the most memory the program may plan at the bounds of its dynamic dims, in GiB (default
            2). Over it, default bounds are halved (the one that lowers the plan most, never below the example
            inputs) before lowering and, if the lowered plan still exceeds it, again; a plan over it that a bound
            you set causes is refused, naming the dim. What was lowered is logged and recorded in
            ``manifest["executorch"]["memory_budget"]``. ``None``: no budget.
        quantize: a quantization recipe (or an ``hfexport.Quantization``) of the variant (``_quantize.py``):
            ``"8da4w"`` (stage 1, a torchao source transform) or ``"int8"`` (stage 4, PT2E static int8) for
            ``xnnpack``. The export is then verified against float eager by cosine similarity.
    """

    backend: str = "xnnpack"
    alloc_graph_input: bool = True
    alloc_graph_output: bool = True
    alloc_mutable_buffers: bool = True
    max_batch: int | None = None
    max_seq_len: int | None = None
    dim_upper_bound: int | None = None
    memory_budget_gib: float | None = 2.0
    quantize: str | Quantization | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        require_executorch()  # at the first line of an export, not at its first toolchain call
        if variant_registration(self.backend) is None:
            raise ValueError(f"unknown ExecuTorch variant backend={self.backend!r}; registered variants: "
                             f"{', '.join(map(repr, backend_variants(load_plugins=False)))} (vendors add one "
                             "with hfexport_executorch.register_backend_prepare)")
        for name in ("alloc_graph_input", "alloc_graph_output", "alloc_mutable_buffers"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"{name} must be True or False, got {getattr(self, name)!r}")
        if self.dim_upper_bound is not None and (isinstance(self.dim_upper_bound, bool) or not isinstance(
                self.dim_upper_bound, int) or self.dim_upper_bound < 2):
            raise ValueError(f"dim_upper_bound must be an int >= 2 (the largest size of a dynamic dimension) or "
                             f"None (the default), got {self.dim_upper_bound!r}")
        for name in ("max_batch", "max_seq_len"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ValueError(f"{name} must be None or an int >= 1 (the largest size planned for), got {value!r}")
        budget = self.memory_budget_gib
        if budget is not None and (isinstance(budget, bool) or not isinstance(budget, int | float) or budget <= 0):
            raise ValueError(f"memory_budget_gib must be a number of GiB > 0 or None (no budget), got {budget!r}")
        if self.quantize is not None:  # a float export reads no quantization code
            self.quantize = resolve_executorch_quantization(self.quantize, self.backend)


def executorch_config(ctx: ExportContext) -> ExecutorchConfig:
    """The :class:`ExecutorchConfig` of an ExecuTorch export's context, typed.

    Raises:
        TypeError: the context's config is another backend's.
    """
    # isinstance here, not ctx.config_as: the patches read it while torch runs, a call back into the kernel there
    if not isinstance(ctx.config, ExecutorchConfig):
        raise TypeError(f"this export's config is an instance of {type(ctx.config).__name__}, not of ExecutorchConfig")
    return ctx.config
