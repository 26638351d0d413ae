"""OpenVINOExporter: the dynamo trace, OpenVINO's decompositions, ``openvino.convert_model``, then OpenVINO IR
(``openvino_model.xml`` + ``openvino_model.bin``) compiled on OpenVINO's CPU plugin.

The file follows the pipeline: the exporter, whose ``prepare`` and ``lower`` run the three stages and, between them,
the toolchain steps; then a ``# ── Stage N: Title ──`` banner per stage, naming the module of ``workarounds/`` that
holds its registered workarounds.

1. OpenVINO torch patches — ``@register_patch("openvino", ...)``, active while capturing and converting.
   → capture: the dynamo stages, then ``torch.export.export`` (the kernel's pipeline, ``DYNAMO_TRACER.capture``).
   → ``ExportedProgram.run_decompositions`` with OpenVINO's table (the one ``openvino.convert_model`` applies).
2. Graph preparation — ``@register_fx_node_fix("openvino")`` rewrites of the decomposed graph.
   → ``openvino.convert_model`` on the prepared graph (its FX decoder).
3. Stateful transformation — for a generation program, the KV-cache inputs and outputs become OpenVINO variables
   (``ReadValue``/``Assign``, as ``openvino.passes.MakeStateful`` makes them, with a zeros initializer:
   ``_graph.make_stateful``).
   → ``nncf.compress_weights`` (with ``quantize=``) → ``openvino.save_model`` and ``Core.compile_model`` on the CPU
   plugin with the registered ``openvino_cpu_property`` workarounds, which open the runner the export is verified on.

Every workaround can be left out by name with ``disable=("<function name>",)``; its docstring says **Why**,
**Upstream** and **Remove when**. The runner, I/O names and the reading of untrusted IR are private modules of the
package.
"""
from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any, ClassVar

from hfexport import Quantization
from hfexport.plugin import (
    Component,
    ExportConfig,
    ExportContext,
    ExportedModel,
    Exporter,
    RuntimeNeeds,
    Stage,
    Step,
    artifact_file,
    component_manifest,
)
from hfexport.quantization import check_quantization_inputs
from hfexport.trust import artifact_bytes
from hfexport_dynamo import DYNAMO_TRACER

from ._config import OpenVINOConfig
from ._graph import constants_inlined, make_growing_stateful, make_stateful, model_io_names
from ._naming import io_names, name_model_io
from ._quantize import compress_weights
from ._runner import DATA_FILE, MODEL_FILE, OpenVINORunner
from ._state import OpenVINOState, openvino_state
from ._untrusted import check_ir_file
from .workarounds import cpu_properties, node_fixes  # noqa: F401 - registers the workarounds of stages 2 and 3

__all__ = ["MODEL_FILE", "DATA_FILE", "OpenVINOConfig", "OpenVINOExporter", "OpenVINORunner"]


class OpenVINOExporter(Exporter):
    """Export to OpenVINO IR (``openvino_model.xml`` + ``openvino_model.bin``), verified on OpenVINO's CPU plugin."""

    name: ClassVar[str] = "openvino"
    config_class: ClassVar[type[ExportConfig]] = OpenVINOConfig
    tracer = DYNAMO_TRACER
    checked_on_read: ClassVar[tuple[str, ...]] = ("openvino.model_file", "openvino.data_file")  # artifact_bytes
    scopes: ClassVar[tuple[str, ...]] = ("dynamo", "openvino")
    # Peak RSS / weight bytes of a text-generation export of the seeded 0.5 B Qwen2 (1,976 MB of fp32 weights):
    # fp32 7,243 MiB (benchmarks/results/bench_generation_0.5b.txt, openvino run 4, 2026-12-03); artifact 1.00x.
    export_peak_ratio: ClassVar[dict[str | None, float]] = {None: 3.8}
    @property  # type: ignore[override]
    def needs(self) -> RuntimeNeeds:
        """The CPU plugin keeps OpenVINO variables (ReadValue/Assign) between the calls of one infer request. With
        ``kv_cache="growing"`` (default) a text-generation cache grows: the program takes and returns it
        (``cache_layout="growing"``) and stage 3 makes each a variable that its ``ScaledDotProductAttention`` appends
        to; otherwise a program's mutable buffers (a fixed cache) become variables (``"in_place"``)."""
        return RuntimeNeeds(cache_layout="growing" if self.openvino_config.kv_cache == "growing" else "in_place")
    toolchain: ClassVar[tuple[str, ...]] = (*DYNAMO_TRACER.toolchain, "openvino", "hfexport-openvino")
    tested_versions: ClassVar[dict[str, str]] = {**DYNAMO_TRACER.tested_versions, "openvino": "2026.4.1"}
    stages: ClassVar[tuple[Stage, ...]] = (
        Stage(1, "OpenVINO torch patches", '@register_patch("openvino", ...)'),
        Stage(2, "Graph preparation (OpenVINO decompositions)", '@register_fx_node_fix("openvino")'),
        Stage(3, "Stateful transformation", "internal"),
    )
    steps: ClassVar[tuple[Step, ...]] = (
        Step(1, "capture", "the dynamo stages, torch.export.export"),
        Step(1, "decompose", "ExportedProgram.run_decompositions"),
        Step(2, "convert", "openvino.convert_model"),
        Step(3, "compress", "nncf.compress_weights"),  # quantize= only
        Step(3, "compile", "openvino.save_model, Core.compile_model"),
    )

    @property
    def openvino_config(self) -> OpenVINOConfig:
        """This exporter's config, typed."""
        return self.config_as(OpenVINOConfig)

    def new_state(self, ctx: ExportContext) -> OpenVINOState:
        return OpenVINOState()

    def prepare(self, ctx: ExportContext) -> None:
        """Stage 1: the patches capture and conversion run under."""
        with ctx.stage(1):
            ctx.install_patches(("openvino",))

    def lower(self, ctx: ExportContext) -> None:
        """Stages 2-3 and the steps between them, top to bottom: the captured program to a compiled OpenVINO model."""
        import openvino
        import torch
        from openvino.frontend.pytorch.fx_decoder import TorchFXPythonDecoder

        state, config = openvino_state(ctx), self.openvino_config
        with ctx.step("ExportedProgram.run_decompositions"):
            prepared = ctx.program.run_decompositions(_openvino_decompositions())
        with ctx.stage(2):
            ctx.apply_fx_node_fixes(prepared.graph_module, ("openvino",))
        state.io = io_names(ctx.program, ctx.inputs)
        growing = growing_cache_pairs(ctx.model, ctx.inputs, state.io)
        graph, program_states = constants_inlined(prepared)  # mutable buffers stay inputs/outputs
        placeholders = [node.name for node in graph.graph.nodes if node.op == "placeholder"]
        with ctx.step("openvino.convert_model"), torch.no_grad(), _root_logger_kept():
            # convert_model(ExportedProgram) decodes program.module(), where a mutated buffer is lost (_graph.py)
            model = openvino.convert_model(TorchFXPythonDecoder(graph, dynamic_shapes=True))
        del graph
        inputs, outputs = model_io_names(prepared, program_states, state.io)
        del prepared
        dropped = set(name_model_io(model, inputs, outputs, placeholders))
        if dropped:  # inputs no node reads: the runner feeds nothing for them
            state.io["input_leaves"] = [None if n in dropped else n for n in state.io["input_leaves"]]
        with ctx.stage(3):
            if program_states:
                state.states = make_stateful(model, program_states)
            if growing:
                state.growing_states = make_growing_stateful(model, growing["pairs"], growing["shapes"])
        if isinstance(config.quantize, Quantization):
            with ctx.step("nncf.compress_weights"):
                model, state.quantization = compress_weights(model, config.quantize, config.int4_ratio)
        state.quantization = with_runtime_precision(state.quantization, config)

        properties: dict[str, str] = {}
        for registration in ctx.workarounds(_CPU_PROPERTIES, ("openvino",)):
            properties.update(registration.func())
            ctx.record_applied(registration.qualified_name)
        precisions = {"inference_precision": config.inference_precision,
                      "kv_cache_precision": config.kv_cache_precision}
        io = {**state.io, "num_threads": config.num_threads, "cpu_properties": properties, **precisions,
              "growing_states": state.growing_states}
        with ctx.step("openvino.save_model, Core.compile_model"), \
                OpenVINORunner.temporary_directory("openvino") as directory:
            openvino.save_model(model, directory / MODEL_FILE, compress_to_fp16=config.compress_to_fp16)
            state.runner = OpenVINORunner(directory / MODEL_FILE, directory / DATA_FILE, io=io).owning(directory)
        state.manifest = {"model_file": MODEL_FILE, "data_file": DATA_FILE, "device": "CPU",
                          "num_threads": config.num_threads, "cpu_properties": properties,
                          "compress_to_fp16": config.compress_to_fp16,
                          **precisions, "growing_states": state.growing_states,
                          "states": state.states, "node_count": len(model.get_ordered_ops()), **state.io}

    # ── artifact, loading ─────────────────────────────────────────────────────────────────────────────
    def package(self, ctx: ExportContext) -> ExportedModel:
        state = openvino_state(ctx)
        if state.runner is None:
            raise RuntimeError("package() runs after lower(), which compiles the model")
        write = state.runner.write_files
        if state.growing_states:  # OpenVINO GenAI's LLMPipeline runs the component's folder as it is
            from ._genai import GenAIFiles

            genai = GenAIFiles(getattr(ctx.model, "model", ctx.model), self.openvino_config.tokenizer)
            state.manifest["genai"] = genai.manifest
            runner = state.runner

            def write(directory: Path) -> list[str]:
                return [*runner.write_files(directory), *genai.write(directory)]
        section = {"program_file": MODEL_FILE, "openvino": state.manifest,
                   **({"quantization": state.quantization} if state.quantization else {})}
        # OpenVINO GenAI's LLMPipeline(dir) reads openvino_model.xml (and its .bin beside it) at the artifact's root
        return self.artifact(ctx, [Component("model", state.runner, ctx.program.call_spec.out_spec,
                                             write, section, ctx.program, at_root=bool(state.growing_states))])

    def check_inputs(self, inputs: Any, model: Any = None) -> None:
        """The kernel's checks, then ``quantize``'s: a model quantized already is refused before any work."""
        super().check_inputs(inputs, model)
        config = self.openvino_config
        if config.quantize is not None:
            check_quantization_inputs(config.quantize, inputs, model, backend=self.name,
                                      static_shapes=not config.dynamic and not config.dynamic_shapes)

    @classmethod
    def load_runner(cls, path: Path, manifest: dict[str, Any], component: str = "model", *,
                    trust_remote_code: bool = False) -> OpenVINORunner:
        """Compile ``openvino_model.xml`` (weights ``openvino_model.bin``, both hashed in the manifest) on the CPU
        plugin, with the ``INFERENCE_NUM_THREADS`` it was exported with.

        The IR is read as untrusted input whatever ``trust_remote_code`` says: an IR that needs an extension library
        (a layer outside OpenVINO's own operation sets) or declares XML entities is refused
        (``_untrusted.check_ir_file``), and the weights are read only from the ``.bin`` the manifest lists. Only the
        bounds on its size (layers, tags, the longest path: ``compile_model``'s time) are lifted by
        ``trust_remote_code=True``.

        Raises:
            hfexport.UntrustedArtifactError, hfexport.ManifestError: a file the manifest names is missing or outside
                the artifact.
            ValueError: the IR is refused (the message names the layer).
        """
        section = component_manifest(manifest, component).get("openvino", {})
        where = f"components[{component!r}].openvino"
        model_path = artifact_file(path, manifest, section.get("model_file"), f"{where}.model_file")
        data_path = artifact_file(path, manifest, section.get("data_file"), f"{where}.data_file")
        # each file read once by descriptor and checked; OpenVINO gets those bytes, never the paths again
        model_bytes = artifact_bytes(path, manifest, section.get("model_file"), f"{where}.model_file")
        weights_bytes = artifact_bytes(path, manifest, section.get("data_file"), f"{where}.data_file")
        check_ir_file(model_path, model_bytes, len(weights_bytes), trust_remote_code=trust_remote_code)
        if not trust_remote_code:
            # the CPU plugin's snippets (JIT-fused element-wise subgraphs) off, whatever the manifest says: they
            # compile element-wise chains in time that grows with the cube of their length, branches and side
            # inputs included, which no bound on runs checks (issue 43: 500 Maximum(Relu(h), h) 3.1 s of CPU, 0.2 s
            # without); decoders' IRs compile to the same nodes without them (no Subgraph in Qwen2.5-0.5B's or a
            # 32-block Llama's runtime model either way)
            section = {**section, "cpu_properties": {**(section.get("cpu_properties") or {}),
                                                     "SNIPPETS_MODE": "DISABLE"}}
        return OpenVINORunner(model_path, data_path, io=section, untrusted=True, model_bytes=model_bytes,
                              weights_bytes=weights_bytes)


PRECISION_MIN_COSINE = 0.98  # the verification's threshold for logits computed or cached below float32


def with_runtime_precision(quantization: dict[str, Any] | None, config: OpenVINOConfig) -> dict[str, Any] | None:
    """The component manifest's ``quantization`` section with the CPU plugin's precisions where either is below
    float32 (``inference_precision``, ``kv_cache_precision``): the export is then verified by cosine similarity
    against float eager, with the top-1 agreement of its logits reported (``hfexport.quantization.
    compare_quantized``), as a weight-quantized one. ``quantization`` unchanged at float32."""
    if config.inference_precision == "f32" and config.kv_cache_precision == "f32":
        return quantization
    precisions = {"inference_precision": config.inference_precision,
                  "kv_cache_precision": config.kv_cache_precision}
    if quantization is None:
        recipe = f"inference-{config.inference_precision}, kv-cache-{config.kv_cache_precision}"
        return {"recipe": recipe, "min_cosine": PRECISION_MIN_COSINE, **precisions}
    return {**quantization, **precisions}


def growing_cache_pairs(program_module: Any, inputs: Any, io: dict[str, Any]) -> dict[str, Any] | None:
    """For a generation program whose cache grows (``CausalLMStep.growing_cache``), its cache leaves renamed in
    ``io`` (in place) as OpenVINO GenAI and optimum-intel name them: inputs ``past_key_values.<layer>.key`` /
    ``.value``, outputs ``present.<layer>.key`` / ``.value``, and the ``(input, output)`` pairs with each tensor's
    dims after the batch, None where it grows (``[kv_heads, None, head_dim]``); None for any other program. A
    linear-attention layer's fixed-size states (``CausalLMStep.state_layers``: LFM2's conv state, Qwen3-Next's conv
    and recurrent states) are ``past_key_values.<layer>.conv`` / ``.recurrent``, all their dims static."""
    if not getattr(program_module, "growing_cache", False):
        return None
    cache = inputs["cache"]
    states = getattr(program_module, "state_layers", frozenset())
    names = [f"{i}.{kind}" for i, layer in enumerate(cache)
             for kind in (("conv", "recurrent")[:len(layer)] if i in states else ("key", "value"))]
    shapes = [[int(d) for d in t.shape[1:]] if i in states else [int(t.shape[1]), None, int(t.shape[3])]
              for i, layer in enumerate(cache) for t in layer]
    leaves = io["input_leaves"]
    first = len(leaves) - len(names)  # the cache is the program's last input
    io["input_leaves"] = [*leaves[:first], *(f"past_key_values.{n}" for n in names)]
    outputs = io["output_leaves"]  # {"logits", "cache"}: the logits, then the cache's leaves
    io["output_leaves"] = [outputs[0], *(f"present.{n}" for n in names)]
    return {"pairs": [(f"past_key_values.{n}", f"present.{n}") for n in names], "shapes": shapes}


@contextlib.contextmanager
def _root_logger_kept() -> Any:
    """Restore the root logger's level, filters and handlers after the body, also on error.

    ``openvino.convert_model`` sets the root logger to ERROR (``ovc.logger.init_logger``) and restores it only when
    the conversion succeeds (``openvino/tools/ovc/convert.py``, no ``finally``): after a failed export the caller's
    warnings and hfexport's own stopped printing."""
    import logging

    root = logging.getLogger()
    level, filters, handlers = root.level, list(root.filters), list(root.handlers)
    try:
        yield
    finally:
        root.setLevel(level)
        root.filters, root.handlers = filters, handlers


def _openvino_decompositions() -> Any:
    """The decomposition table ``openvino.convert_model`` runs on an ``ExportedProgram``: torch's default
    (``torch.export.default_decompositions``) less the ops OpenVINO's frontend converts whole
    (``openvino.frontend.pytorch.torchdynamo.export_decompositions.ops_to_not_decompose``)."""
    from openvino.frontend.pytorch.torchdynamo.export_decompositions import ops_to_not_decompose
    from torch.export import default_decompositions

    table = default_decompositions()
    for op in ops_to_not_decompose():
        table.pop(op, None)
    return table


# ── Stage 1: OpenVINO torch patches ──
# None registered yet: ``@register_patch("openvino", ...)`` factories would go in workarounds/torch_patches.py.

# ── Stage 2: Graph preparation (OpenVINO decompositions) ──
# Registered in workarounds/node_fixes.py (``@register_fx_node_fix("openvino")``), applied by ``lower``.

# ── Stage 3: Stateful transformation ──
# Internal (``_graph.make_stateful``); the CPU plugin's properties of the step ``Core.compile_model`` after it are
# registered in workarounds/cpu_properties.py, looked up by the registry kind below.
_CPU_PROPERTIES = "openvino_cpu_property"  # the registry kind (its extension point)
