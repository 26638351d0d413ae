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

from hfexport.plugin import ExportContext, InvalidInputError, RuntimeNeeds, Stage

from ._config import trace_state
from ._linear_attention_patches import SCOPE as LINEAR_ATTENTION_SCOPE
from ._pytree import register_transformers_pytrees
from ._quiet import no_loading_bar
from .capture import CAPTURE_STAGES, IGNORED_KWARGS, KWARG_ALIASES, capture
from .describe import _spec_modules, describe_inputs, describe_outputs, second_shape_inputs
from .inputs import dummy_inputs, forward_parameters

__all__ = ["DYNAMO_TRACER", "DynamoTracer"]

logger = logging.getLogger("hfexport")

class DynamoTracer:
    """Transformers model support for exporters that trace with ``torch.export`` (see the module docstring).

    Attributes:
        toolchain: the distributions a trace depends on, for the manifest's ``versions`` (a backend adds its own).
        tested_versions: the versions this package was tested with (a backend adds its own).
    """

    toolchain: tuple[str, ...] = ("torch", "transformers", "hfexport-core", "hfexport-dynamo")
    name: str = "dynamo"
    stages: tuple[Stage, ...] = CAPTURE_STAGES
    scopes: tuple[str, ...] = ("dynamo", "dynamo.trace")  # the scopes every capture installs (stage 2)
    task_scopes: tuple[str, ...] = (LINEAR_ATTENTION_SCOPE,)  # text generation's step installs, around its forward
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
        from hfexport.trust import treespec_names

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

    # The capture step of every export: the five dynamo stages, then torch.export.export (capture.py); sets and
    # returns ctx.program.
    capture = staticmethod(capture)

    def task_options(self, task: str) -> type:
        """The options dataclass of ``task`` (:class:`hfexport_dynamo.TaskOptions`, :class:`~hfexport_dynamo.GenerationOptions`
        or :class:`~hfexport_dynamo.ImageTextOptions`). Raises ``ValueError`` for an unknown task."""
        from .tasks import options_for_task

        return options_for_task(task)

    def plan_task(self, model: Any, task: str, inputs: Mapping[str, Any] | None, options: Any,
                  needs: RuntimeNeeds) -> Any:
        """The components a generative ``task`` exports for a runtime with ``needs`` (its cache layout and attention
        op): :func:`hfexport_dynamo.tasks.plan_task`."""
        from ._cache_attention import attention_for
        from .tasks import plan_task

        # a growing cache is text generation's only; the other tasks keep theirs in place on such a runtime
        stateful = needs.cache_layout in ("in_place", "growing")
        return plan_task(model, task, inputs, max_cache_len=options.max_cache_len, max_batch=options.max_batch,
                         prefill_chunk=getattr(options, "prefill_chunk", None),
                         max_images=getattr(options, "max_images", None),
                         stateful=stateful, fused_cache_attention=attention_for(needs.attention, stateful),
                         growing=needs.cache_layout == "growing")

    def generate(self, exported: Any, input_ids: Any, attention_mask: Any = None, **options: Any) -> Any:
        """Greedy decoding over a task artifact's programs (see :func:`hfexport_dynamo.tasks.generate`)."""
        from .tasks import generate

        return generate(exported, input_ids, attention_mask, **options)

    def artifact_class(self, manifest: dict[str, Any]) -> type:
        """The class :func:`hfexport.load` makes of an artifact: a ``"text-generation"`` one is a
        :class:`~hfexport_dynamo.tasks.loaded.TextGenerationArtifact` (``pipeline("text-generation", model=...)``
        takes it), every other an :class:`~hfexport.ExportedModel`."""
        from hfexport import ExportedModel

        from .tasks.names import TEXT_GENERATION

        if manifest.get("task") == TEXT_GENERATION:
            from .tasks.loaded import TextGenerationArtifact

            return TextGenerationArtifact
        return ExportedModel

    def reference(self, ctx: ExportContext) -> Any:
        model, fixed = ctx.model, dict(trace_state(ctx).fixed_kwargs)
        return lambda **kw: model(**{**fixed, **kw})  # a fixed kwarg passed again (equal: the artifact checks)

    def load_model(self, path: str | Path, trust_remote_code: bool = False,
                   dtype: torch.dtype | None = None) -> torch.nn.Module:
        """``AutoModel`` from a local directory (offline); the task head from ``config.architectures``. With
        ``trust_remote_code``, a model whose config maps its classes to the repository's code (``auto_map``) loads
        through that code (its ``AutoModelForCausalLM`` where it maps one, else its first auto class); without it,
        Transformers refuses such a model. With ``dtype``, Transformers casts each tensor as it reads it (a bf16
        checkpoint loaded in float32 is held once, in float32); without, the checkpoint's dtype."""
        import transformers

        options = {"dtype": dtype} if dtype is not None else {}

        config = transformers.AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code)
        auto_map = getattr(config, "auto_map", None) or {}
        if trust_remote_code and auto_map:
            name = "AutoModelForCausalLM" if "AutoModelForCausalLM" in auto_map else next(
                (k for k in auto_map if k.startswith("AutoModel")), "AutoModel")
            with no_loading_bar():
                return getattr(transformers, name).from_pretrained(path, trust_remote_code=True, **options).eval()
        arch = (getattr(config, "architectures", None) or [None])[0]
        model_cls = getattr(transformers, arch, None) if arch else None
        with no_loading_bar():
            return (model_cls or transformers.AutoModel).from_pretrained(path, **options).eval()

    def sample_inputs(self, model: Any, manifest: dict[str, Any]) -> dict[str, Any] | None:
        """Dummy inputs at batch+1 and seq+5 along the dims the program kept dynamic (traced size otherwise), within
        each dim's range (an ExecuTorch ``--max-batch 2`` export of a batch-2 example is checked at batch 2)."""
        if not hasattr(model, "config"):
            return None
        ids = next((i for i in manifest["inputs"] if i["name"] in ("input_ids", "pixel_values", "input_features",
                                                                   "input_values")), None)
        if ids is None or "example_shape" not in ids:
            return None
        batch, rest = ids["example_shape"][0], ids["example_shape"][1:]
        seq = rest[0] if rest else 8
        dynamic = ids.get("dynamic_dims", {})

        def moved(dim: str, size: int, step: int) -> int:
            upper = (dynamic[dim] or {}).get("max") if isinstance(dynamic.get(dim), dict) else None
            return size + step if upper is None else max(size, min(size + step, int(upper)))

        return dummy_inputs(model, batch=moved("0", batch, 1) if "0" in dynamic else batch,
                            seq=moved("1", seq, 5) if "1" in dynamic and ids["name"] == "input_ids" else seq, seed=1)


    def second_shape_inputs(self, ctx: ExportContext, inputs: Mapping[str, Any], *,
                            smallest: bool = False) -> dict[str, Any] | None:
        """``inputs`` at a second shape for the export's verification: each symbol of the program's dynamic input
        dims moved by one (up, else down) within its range, so that its parity differs from the traced one; with
        ``smallest``, each symbol at the least size of its range (at least 1: a count of images or rows goes to
        1), so that a size below the example is checked too. Each tensor is resized along those dims by truncating
        or by repeating its own leading slices, so that token ids and masks stay valid. None when nothing can move
        (static, or every range a single size; with ``smallest``, every example size already its range's least)."""
        return second_shape_inputs(ctx.program, inputs, smallest=smallest)


DYNAMO_TRACER = DynamoTracer()


