"""DynamoExporter: ``torch.export`` of Transformers models (and any ``nn.Module``) to a ``.pt2`` program.

Its five stages prepare the model for ``torch.export.export``; the ONNX and ExecuTorch exporters run
this pipeline (nested, stage by stage) to get their ``ExportedProgram``:

1. Forward signature patch — a flat, explicit signature from the sample inputs (internal).
2. Model patches — ``@register_patch("dynamo", ...)``.
3. Pytree registration — every ``Cache`` and ``ModelOutput`` flattens and rebuilds.
4. Dynamic shapes — ``Dim.AUTO`` on every tensor and cache leaf when ``dynamic=True``; overridden by
   ``DynamoConfig.dynamic_shapes``.
5. State cleanup — tensor attributes a model sets inside ``forward`` (``_STATEFUL_CACHE_ATTRS``) are
   saved, nulled for the trace and restored; the trace (``torch.export.export``) runs here.
"""

from __future__ import annotations

import contextlib
import copy
import datetime
import inspect
import logging
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import torch
import torch.utils._pytree as pytree
from torch.export import Dim

from hfexport import (
    ExportConfig,
    ExportContext,
    ExportedModel,
    Exporter,
    Stage,
    patch_context,
    register_patch,
    run_stages,
)
from hfexport._artifact import SCHEMA_VERSION, versions_of

from ._pytree import register_transformers_pytrees
from .inputs import dummy_inputs, forward_parameters

__all__ = ["DynamoConfig", "DynamoExporter", "DynamoRunner", "EXPORT_SKIPS", "PROGRAM_FILE"]

logger = logging.getLogger("hfexport")
PROGRAM_FILE = "model.pt2"

# Tensor attributes that some modules set inside forward (a rotary-embedding cache keyed on the last
# sequence length). Left set from an eager call, the trace would bake the stale tensor in as a constant
# and branch on a Python int; nulled, the module recomputes it inside the graph.
_STATEFUL_CACHE_ATTRS: tuple[str, ...] = (
    "cached_sequence_length",              # wav2vec2_conformer / wav2vec2_bert / seamless_m4t / clvp rotary
    "cached_rotary_positional_embedding",  # same modules: the cached cos/sin stack
    "_cached_decode_position_ids",         # glm_image: decode position ids from the prompt
)

_CACHE_INPUT_NAMES = ("cache", "past_key_values", "cache_params")

# Model classes that are not exportable as they are: class name -> the model-side change that would make
# them exportable. `hfexport sweep --recheck-skips` re-runs them; the list should shrink.
# Every entry was investigated on the tiny zoo case (transformers 5.24, torch 2.15, dynamic=True): the
# `TORCH_LOGS=+dynamic` guard that specializes the sequence, or the data-dependent op, is named in the reason.
# A class whose sequence length gets specialized exports, but only for the traced length ("runtime_error:
# Guard failed: input_ids.size()[1] == 8" at any other length), which is not a usable dynamic export.
EXPORT_SKIPS: dict[str, str] = {
    **dict.fromkeys(
        ("CanineModel", "CanineForSequenceClassification", "CanineForQuestionAnswering",
         "CanineForTokenClassification"),
        "CanineAttention.forward builds its local-attention chunks with a Python loop over range(seq_len) "
        "(modeling_canine.py): torch.export specializes the sequence length to the traced one. Exportable with a "
        "dynamic sequence once the chunks are cut with tensor ops (pad + unfold/view) instead of a Python list."),
    **dict.fromkeys(
        ("CpmAntModel", "CpmAntForCausalLM"),
        "CpmAntModel._prepare_attention_mask builds the left-padding mask from "
        "torch.tensor(list(range(seqlen - prompt_length))[::-1]), a Python list sized by the sequence, which "
        "specializes its length. Exportable once it is torch.arange(seqlen - prompt_length - 1, -1, -1)."),
    **dict.fromkeys(
        ("MambaModel", "MambaForCausalLM", "FalconMambaModel", "FalconMambaForCausalLM", "JambaModel",
         "JambaForCausalLM", "JambaForSequenceClassification", "ZambaModel", "ZambaForCausalLM",
         "ZambaForSequenceClassification"),
        "the CPU selective scan (mamba_selective_scan in modeling_mamba / modeling_falcon_mamba / modeling_jamba / "
        "modeling_zamba, used without the CUDA kernels) is a Python loop `for index in range(seq_len)`: unrolled by torch.export, "
        "it specializes the sequence length. Exportable once the scan is a scan op "
        "(torch._higher_order_ops.scan) or the chunked parallel form Mamba2's torch_forward uses."),
    **dict.fromkeys(
        ("RwkvModel", "RwkvForCausalLM"),
        "rwkv_linear_attention_cpu (modeling_rwkv.py) runs the WKV recurrence as a Python loop over "
        "range(seq_length): unrolled, it specializes the sequence length. Exportable once the recurrence is a "
        "scan op (torch._higher_order_ops.scan) or a chunked parallel WKV."),
    **dict.fromkeys(
        ("RecurrentGemmaModel", "RecurrentGemmaForCausalLM"),
        "RecurrentGemmaRglru._rnn_scan loops `for t in range(hidden_states.shape[1])`: unrolled, it specializes "
        "the sequence length. Exportable once the RG-LRU recurrence is a scan op (torch._higher_order_ops.scan) "
        "or an associative scan."),
    **dict.fromkeys(
        ("xLSTMModel", "xLSTMForCausalLM"),
        "the native mLSTM kernels loop in Python over the chunks and the time steps of the sequence "
        "(mlstm_chunkwise_recurrent_fw_C: `for key in range(0, num_chunks)`; mlstm_recurrent_sequence_native: "
        "`for t in range(sequence_length)`): unrolled, the sequence length is specialized (and the trace takes "
        "~200 s for 2 tiny layers). Exportable once the inter-chunk recurrence is a scan op "
        "(torch._higher_order_ops.scan)."),
    **dict.fromkeys(
        ("FunnelModel", "FunnelBaseModel", "FunnelForMaskedLM", "FunnelForQuestionAnswering",
         "FunnelForSequenceClassification", "FunnelForTokenClassification"),
        "FunnelAttentionStructure.get_position_embeds keeps positions as Python lists from range(seq_len) "
        "(static on purpose, says its comment) and pools them in Python: the sequence length is specialized. "
        "Exportable with a dynamic sequence once positions and their pooling use torch.arange and tensor slicing."),
    **dict.fromkeys(
        ("LongformerModel", "LongformerForMaskedLM", "LongformerForSequenceClassification",
         "LongformerForTokenClassification", "LEDModel", "LEDForConditionalGeneration", "LEDForQuestionAnswering"),
        "`_chunk` (LongformerSelfAttention / LEDEncoderSelfAttention) counts chunks with "
        "torch.div(hidden_states.size(1), 2 * window_overlap, rounding_mode='trunc'), a tensor, so view() gets a "
        "data-dependent size (GuardOnDataDependentSymNode: Eq(u1, 1)). Exportable once the count is the int "
        "hidden_states.size(1) // (2 * window_overlap)."),
    **dict.fromkeys(
        ("OpenAIPrivacyFilterModel", "OpenAIPrivacyFilterForTokenClassification"),
        "OpenAIPrivacyFilterExperts.forward loops over the experts that received tokens (`for expert_idx in "
        "expert_hit`, from nonzero()) and gathers them with torch.where: a data-dependent Python loop "
        "(GuardOnDataDependentSymNode). Exportable once the experts run batched over all experts, as GptOss's "
        "experts do (gpt_oss exports)."),
    **dict.fromkeys(
        ("SwitchTransformersModel", "SwitchTransformersForConditionalGeneration"),
        "SwitchTransformersTop1Router.forward reassigns a submodule (`self.classifier = "
        "self.classifier.to(self.dtype)`), which torch.export cannot trace (RuntimeError: Cannot swap t1 because "
        "it has weakref associated with it). Exportable once the cast happens at load time, not in forward."),
    **dict.fromkeys(
        ("SEWModel", "SEWForCTC", "SEWForSequenceClassification", "SEWDModel", "SEWDForCTC",
         "SEWDForSequenceClassification"),
        "SEWEncoder / SEWDEncoder.forward reconcile the pooled and upsampled lengths with Python min() and "
        "`if hidden_states.shape[1] < n_input_timesteps: pad`, branches on sizes resolved for the traced length, "
        "so other input lengths fail a guard. Exportable once both are unconditional tensor ops (slice to "
        "torch.sym_min, pad by n_input_timesteps - length, possibly 0)."),
}


@dataclass
class DynamoConfig(ExportConfig):
    """Options of the ``dynamo`` backend.

    Attributes:
        strict: trace with TorchDynamo's strict mode (``torch.export.export(strict=True)``); the default
            non-strict mode traces Python as it runs, which Transformers models need.
        fixed_kwargs: forward keyword arguments baked into the program (not inputs), e.g.
            ``{"output_hidden_states": True}``. ``use_cache=False`` is added for models that take it,
            unless ``past_key_values`` is an input.
    """

    strict: bool = False
    fixed_kwargs: Mapping[str, Any] | None = None


class _ExportSignature(torch.nn.Module):
    """Calls ``model(**dict(zip(names, args)), **fixed_kwargs)``; forward gets an explicit signature."""

    def __init__(self, model: torch.nn.Module, names: list[str], fixed_kwargs: dict[str, Any]):
        super().__init__()
        self.model = model
        self.input_names = list(names)
        self.fixed_kwargs = dict(fixed_kwargs)

    def forward(self, *args: Any) -> Any:
        return self.model(**dict(zip(self.input_names, args, strict=True)), **self.fixed_kwargs)


def _with_signature(model: torch.nn.Module, names: list[str], fixed: dict[str, Any]) -> _ExportSignature:
    """A wrapper whose ``forward(self, input_ids, attention_mask, ...)`` names the program's inputs."""
    params = [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    params += [inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD) for n in names]

    def forward(self: _ExportSignature, *args: Any) -> Any:
        return _ExportSignature.forward(self, *args)

    forward.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
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


class DynamoRunner:
    """Runs an ``ExportedProgram`` (in memory or loaded from ``model.pt2``) with eager PyTorch kernels."""

    def __init__(self, program: torch.export.ExportedProgram):
        self.program = program
        self._module = program.module()

    def run(self, args: tuple[Any, ...]) -> list[Any]:
        with torch.no_grad():
            return pytree.tree_leaves(self._module(*args))


class DynamoExporter(Exporter):
    """Export to a ``torch.export`` program (``model.pt2``), runnable with ``torch.export.load``."""

    name: ClassVar[str] = "dynamo"
    config_class: ClassVar[type[ExportConfig]] = DynamoConfig
    scopes: ClassVar[tuple[str, ...]] = ("dynamo",)
    toolchain: ClassVar[tuple[str, ...]] = ("torch", "transformers", "hfexport-core", "hfexport-dynamo")
    tested_versions: ClassVar[dict[str, str]] = {"torch": "2.15.0", "transformers": "5.24.0"}
    dynamo_stages: ClassVar[tuple[Stage, ...]] = (
        Stage(1, "Forward signature patch", "internal", "stage_forward_signature"),
        Stage(2, "Model patches", '@register_patch("dynamo", ...)', "stage_model_patches"),
        Stage(3, "Pytree registration", "hfexport_dynamo.register_cache_type", "stage_pytree_registration"),
        Stage(4, "Dynamic shapes", "DynamoConfig.dynamic_shapes", "stage_dynamic_shapes"),
        Stage(5, "State cleanup", "_STATEFUL_CACHE_ATTRS", "stage_state_cleanup", runs="torch.export.export"),
    )
    stages: ClassVar[tuple[Stage, ...]] = dynamo_stages

    # ── inputs ────────────────────────────────────────────────────────────────────────────────────────
    def prepare_inputs(self, model: Any, inputs: Mapping[str, Any] | None) -> dict[str, Any]:
        if inputs is None:
            if not hasattr(model, "config"):
                return super().prepare_inputs(model, inputs)  # raises InvalidInputError: inputs needed
            return dummy_inputs(model)
        return super().prepare_inputs(model, inputs)

    def check_inputs(self, inputs: Any) -> None:
        register_transformers_pytrees()  # so that Cache inputs flatten to tensors (stage 3 re-checks)
        super().check_inputs(inputs)

    def trace(self, ctx: ExportContext) -> torch.export.ExportedProgram:
        """Run the dynamo stages (nested under the calling backend's stage) and return the program."""
        if ctx.program is None:
            timings = run_stages("dynamo", self.dynamo_stages, self, ctx, ctx.model_class, ctx.progress,
                                 depth=1 if self.stages is not self.dynamo_stages else 0)
            ctx.report["timings"].update(timings)
        return ctx.program

# ── Stage 1: Forward signature patch ──
    def stage_forward_signature(self, ctx: ExportContext) -> None:
        names, takes_kwargs = forward_parameters(ctx.model)
        unknown = [n for n in ctx.inputs if n not in names and not takes_kwargs]
        if unknown:
            raise TypeError(f"{ctx.model_class}.forward takes no {unknown}; it takes {names}")
        # Python constants among the inputs (use_cache=False, return_dict=True) are not program inputs: they
        # are baked in, and ExportedModel accepts them again only with the same value.
        fixed = {n: v for n, v in ctx.inputs.items() if isinstance(v, bool | int | float | str | type(None))}
        ctx.inputs = {n: v for n, v in ctx.inputs.items() if n not in fixed}
        # transformers 5 names the cache argument `cache` (`past_key_values` is its deprecated alias).
        has_cache_input = any(n in ctx.inputs for n in _CACHE_INPUT_NAMES)
        if "use_cache" in names and "use_cache" not in ctx.inputs:
            fixed["use_cache"] = has_cache_input
        fixed.update(ctx.config.fixed_kwargs or {})  # type: ignore[attr-defined]
        ctx.extras["fixed_kwargs"] = fixed
        ctx.extras["wrapper"] = _with_signature(ctx.model, list(ctx.inputs), fixed)

# ── Stage 2: Model patches ──
    def stage_model_patches(self, ctx: ExportContext) -> None:
        report = ctx.stack.enter_context(patch_context(("dynamo",), ctx.config.disable))
        ctx.report["patches"].extend(r.as_dict() | {"path": p} for r, p in report.installed)
        ctx.report["skipped_patches"].extend(r.as_dict() | {"path": p, "reason": why} for r, p, why in report.skipped)

# ── Stage 3: Pytree registration ──
    def stage_pytree_registration(self, ctx: ExportContext) -> None:
        new = register_transformers_pytrees()
        if new:
            logger.debug("registered pytree nodes: %s", ", ".join(new))
        for name, value in ctx.inputs.items():
            for leaf in pytree.tree_leaves(value):
                if not isinstance(leaf, torch.Tensor | int | float | bool | type(None)):
                    raise TypeError(f"input {name!r} holds a {type(leaf).__name__} that does not flatten to tensors: "
                                    "register it with hfexport_dynamo.register_cache_type(cls, child_attrs=(...))")

# ── Stage 4: Dynamic shapes ──
    def stage_dynamic_shapes(self, ctx: ExportContext) -> None:
        overrides = dict(ctx.config.dynamic_shapes or {})
        unknown = sorted(set(overrides) - set(ctx.inputs))
        if unknown:
            raise KeyError(f"dynamic_shapes names {unknown}, which are not inputs; inputs: {list(ctx.inputs)}")
        if not ctx.config.dynamic and not overrides:
            ctx.extras["dynamic_shapes"] = None
            return
        shapes = []
        for name, value in ctx.inputs.items():
            if name in overrides:
                shapes.append(overrides[name])
            elif ctx.config.dynamic:
                shapes.append(_auto_spec(value))
            else:
                shapes.append(None)
        ctx.extras["dynamic_shapes"] = tuple(shapes)

# ── Stage 5: State cleanup ──
    def stage_state_cleanup(self, ctx: ExportContext) -> None:
        with _nulled_state(ctx.model, _STATEFUL_CACHE_ATTRS) as nulled:
            if nulled:
                ctx.note(f"nulled for the trace and restored: {', '.join(nulled)}")
            args = tuple(copy.deepcopy(v) if not isinstance(v, torch.Tensor) else v for v in ctx.inputs.values())
            ctx.program = torch.export.export(ctx.extras["wrapper"], args, dynamic_shapes=ctx.extras["dynamic_shapes"],
                                              strict=ctx.config.strict)  # type: ignore[attr-defined]

    # ── packaging ─────────────────────────────────────────────────────────────────────────────────────
    def manifest(self, ctx: ExportContext, program: torch.export.ExportedProgram | None = None,
                 **extra: Any) -> dict[str, Any]:
        """The ``export.json`` content shared by every backend built on this pipeline."""
        program = program or ctx.program
        return {
            "schema_version": SCHEMA_VERSION,
            "backend": self.name,
            "model_class": ctx.model_class,
            "model_module": type(ctx.model).__module__,
            "created": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "inputs": describe_inputs(ctx.program, ctx.inputs),
            "outputs": describe_outputs(ctx.program),
            "output_spec": pytree.treespec_dumps(ctx.program.call_spec.out_spec),
            "output_modules": sorted(_spec_modules(ctx.program.call_spec.out_spec)),
            "fixed_kwargs": ctx.extras.get("fixed_kwargs", {}),
            "dynamic": ctx.config.dynamic,
            "config": {k: repr(v) for k, v in vars(ctx.config).items()},
            "versions": versions_of(self.toolchain),
            "tested_versions": dict(self.tested_versions),
            "workarounds": {"patches": ctx.report["patches"], "skipped_patches": ctx.report["skipped_patches"],
                            "fixes": ctx.report["fixes"]},
            "timings_s": ctx.report["timings"],
            "notes": ctx.report["notes"],
            **extra,
        }

    def components(self, ctx: ExportContext) -> dict[str, Any]:
        """Files every artifact carries besides the program: the model's ``config.json`` when it has one."""
        config = getattr(ctx.model, "config", None)
        if config is None or not hasattr(config, "to_json_file"):
            return {}
        return {"config.json": lambda d: config.to_json_file(d / "config.json")}

    def reference(self, ctx: ExportContext) -> Any:
        model, fixed = ctx.model, dict(ctx.extras.get("fixed_kwargs", {}))
        return lambda **kw: model(**kw, **fixed)

    def package(self, ctx: ExportContext) -> ExportedModel:
        program = ctx.program
        components = {PROGRAM_FILE: lambda d: torch.export.save(program, d / PROGRAM_FILE), **self.components(ctx)}
        return ExportedModel(self.name, DynamoRunner(program), self.manifest(ctx, program_file=PROGRAM_FILE),
                             components=components, out_spec=program.call_spec.out_spec,
                             reference=self.reference(ctx))

    @classmethod
    def load_runner(cls, path: Path, manifest: dict[str, Any]) -> DynamoRunner:
        register_transformers_pytrees()
        return DynamoRunner(torch.export.load(path / manifest.get("program_file", PROGRAM_FILE)))

    @classmethod
    def load_model(cls, path: str | Path) -> torch.nn.Module:
        """``AutoModel`` from a local directory (offline); the task head from ``config.architectures``."""
        import transformers

        config = transformers.AutoConfig.from_pretrained(path)
        arch = (getattr(config, "architectures", None) or [None])[0]
        model_cls = getattr(transformers, arch, None) if arch else None
        return (model_cls or transformers.AutoModel).from_pretrained(path).eval()

    @classmethod
    def demo(cls) -> tuple[torch.nn.Module, dict[str, Any], dict[str, Any]]:
        from .demo import minilm_demo

        return minilm_demo()

    @classmethod
    def sample_inputs(cls, model: Any, manifest: dict[str, Any]) -> dict[str, Any] | None:
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

    def hints_for(self, stage: Stage, exc: BaseException) -> list[str]:
        text = str(exc)
        if "not a known type" in text or "register a pytree" in text.lower():
            return ["register the input/output type: hfexport_dynamo.register_cache_type(cls)"]
        return []


# ── Model patches (stage 2) ────────────────────────────────────────────────────────────────────────────
@register_patch("dynamo", "transformers.models.nllb_moe.modeling_nllb_moe.NllbMoeTop2Router._cast_classifier")
def _patch_nllb_moe_cast_classifier(original: Any) -> Any:
    """Skip NLLB-MoE's in-forward ``self.classifier = self.classifier.to(self.dtype)``.

    **Why**: the router reassigns a submodule inside ``forward`` to cast it to the router dtype (a guard
    for bitsandbytes layers). torch.export cannot trace a module attribute being replaced mid-forward.
    During an export the model is already in one dtype, so the cast is a no-op and can be skipped.
    **Upstream**: model-side; transformers casts in forward instead of at load time
    (``NllbMoeTop2Router._cast_classifier``).
    **Remove when**: the cast moves out of ``forward`` (e.g. into ``_init_weights``/load hooks).
    """

    def cast_classifier(self: Any) -> None:
        weight = getattr(self.classifier, "weight", None)
        if weight is not None and weight.dtype != self.dtype:
            raise TypeError(f"NllbMoe router classifier is {weight.dtype} but the router runs in {self.dtype}: "
                            "cast the model to one dtype before exporting")

    return cast_classifier


def _is_dynamic_rope_wrapper(forward: Any) -> bool:
    """Whether ``forward`` is the wrapper that ``transformers.modeling_rope_utils.dynamic_rope_update`` returns."""
    from transformers.modeling_rope_utils import dynamic_rope_update

    code = getattr(forward, "__code__", None)
    return code is not None and code is dynamic_rope_update(lambda *a, **k: None).__code__ and \
        hasattr(forward, "__wrapped__")


@register_patch("dynamo", "transformers.models.*.modeling_*.*RotaryEmbedding.forward")
def _patch_dynamic_rope_update(original: Any) -> Any:
    """Select the dynamic-NTK RoPE frequencies with tensor ops instead of a Python branch on the length.

    **Why**: ``dynamic_rope_update`` recomputes ``inv_freq`` when ``max(position_ids) + 1`` exceeds the cached
    length, with ``if seq_len > max_seq_len_cached``: a Python branch on a data-dependent value, which
    torch.export rejects (``GuardOnDataDependentSymNode: Eq(u0, 1)``) on every backend. The replacement
    computes the scaled frequencies from the runtime length (the rope init functions accept a tensor
    ``seq_len``) and picks them with ``torch.where(seq_len > original_max_seq_len, scaled, original)``, then
    runs the undecorated forward with that ``inv_freq``. This is the value eager computes for a model that
    has not seen a longer sequence before; eager's growth cache (``max_seq_len_cached``) is process state that
    an exported program cannot carry. ``longrope`` already selects with ``torch.where`` in transformers 5 and
    is left to the original; every rope type whose name contains ``dynamic`` takes this path.
    **Upstream**: pytorch/pytorch#163791 (reported on Phi-3.5 longrope; the same branch remains in the
    dynamic NTK update of ``transformers.modeling_rope_utils.dynamic_rope_update``).
    **Remove when**: transformers' dynamic update selects with ``torch.where`` like its longrope update.
    """
    if not _is_dynamic_rope_wrapper(original):
        return original  # not decorated with dynamic_rope_update: decline
    undecorated = original.__wrapped__

    def forward(self: Any, x: torch.Tensor, position_ids: torch.Tensor, layer_type: str | None = None) -> Any:
        rope_type = self.rope_type if layer_type is None else self.rope_type[layer_type]
        kwargs = {"layer_type": layer_type} if layer_type is not None else {}
        if "dynamic" not in rope_type:
            return original(self, x, position_ids, **kwargs)
        from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

        prefix = f"{layer_type}_" if layer_type is not None else ""
        original_inv_freq = getattr(self, f"{prefix}original_inv_freq").to(x.device)
        seq_len = torch.max(position_ids) + 1
        scaled, _ = ROPE_INIT_FUNCTIONS[rope_type](self.config, x.device, seq_len=seq_len, **kwargs)
        inv_freq = torch.where(seq_len > self.original_max_seq_len, scaled.to(original_inv_freq.dtype),
                               original_inv_freq)
        name = f"{prefix}inv_freq"
        saved = self._buffers[name]
        self._buffers[name] = inv_freq
        try:
            return undecorated(self, x, position_ids, **kwargs)
        finally:
            self._buffers[name] = saved

    return forward


# ── helpers for the manifest ───────────────────────────────────────────────────────────────────────────
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
    from hfexport._artifact import flatten_with_names

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
