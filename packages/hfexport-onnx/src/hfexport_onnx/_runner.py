"""OnnxRunner: ``model.onnx`` (weights in ``model.onnx.data``) on an ONNX Runtime session."""

from __future__ import annotations

import contextlib
import re
import warnings
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

import onnx_ir as ir
import torch

from hfexport.memory import anonymous_mappings, collapse_in_background, new_memory
from hfexport.plugin import NamedIORunner

from ._errors import OnnxSessionError
from ._untrusted import check_external_data, external_data_files  # re-exported: the checks moved there

__all__ = ["DATA_FILE", "MODEL_FILE", "OnnxRunner", "available_providers", "check_external_data",
           "external_data_files", "in_place_outputs", "providers_for"]

MODEL_FILE = "model.onnx"
DATA_FILE = f"{MODEL_FILE}.data"
# ONNX Runtime's names of the floating element types (``NodeArg.type``)
_ORT_FLOAT_TYPES = {"tensor(float)": torch.float32, "tensor(double)": torch.float64,
                    "tensor(float16)": torch.float16, "tensor(bfloat16)": torch.bfloat16}


def available_providers() -> list[str]:
    """The execution providers of the installed onnxruntime."""
    import onnxruntime

    return list(onnxruntime.get_available_providers())


def providers_for(section: Mapping[str, Any]) -> list[str]:
    """The providers a saved model was exported for (its manifest's ``onnx`` section) that are installed; CPU
    with a warning when none is."""
    wanted = list(section.get("providers") or ["CPUExecutionProvider"])
    available = available_providers()
    providers = [p for p in wanted if p in available]
    if not providers:
        warnings.warn(f"none of the providers this model was exported for ({', '.join(wanted)}) is "
                      f"available; running on CPUExecutionProvider", stacklevel=3)
        providers = ["CPUExecutionProvider"]
    return providers


_METADATA_ONLY = ("Shape", "Size")  # ops that read a tensor's dims, not its values
_GQA_PRESENTS = {1: 3, 2: 4}  # GroupQueryAttention's present_key / present_value outputs: their past inputs


def in_place_outputs(model: ir.Model) -> dict[str, str]:
    """The graph outputs that ONNX Runtime can write into the memory of a graph input: ``{output: input}``.

    An output qualifies when a ``ScatterND`` writes it from a graph input of the same type and shape that nothing
    else reads (a KV cache of fixed capacity with its new positions written: ``hfexport_dynamo.tasks.kv_cache``),
    or when it is a ``GroupQueryAttention``'s present key or value and its past one is such a graph input (the kernel
    writes the new positions only when the two are one buffer: ``_attention.py``).
    ONNX Runtime's ScatterND copies its data input to its output only when their buffers differ, so with the two
    bound to one buffer it writes just the updates (measured on onnxruntime 1.32: 4 us against 560 us for a
    ``[1, 8, 4096, 64]`` float32 cache). Nothing else reads the input's values (``Shape`` and ``Size`` read its
    dims), so no node sees it half-updated.
    """
    outputs = {value.name: value for value in model.graph.outputs}
    inputs = {value.name: value for value in model.graph.inputs}
    aliases: dict[str, str] = {}
    for name, value in outputs.items():
        node = value.producer()
        if node is None or not node.inputs:
            continue
        if node.op_type == "ScatterND" and node.domain in ("", "ai.onnx"):
            data = node.inputs[0]
        elif node.op_type == "GroupQueryAttention" and node.domain == "com.microsoft":
            index = next((i for i, out in enumerate(node.outputs) if out is value), None)
            if index not in _GQA_PRESENTS or len(node.inputs) <= _GQA_PRESENTS[index]:
                continue
            data = node.inputs[_GQA_PRESENTS[index]]
        else:
            continue
        if data is None or data.name not in inputs or data.name in aliases.values() or data.type != value.type:
            continue
        readers = [use.node for use in data.uses() if use.node is not node]
        if all(reader.op_type in _METADATA_ONLY and reader.domain in ("", "ai.onnx") for reader in readers):
            aliases[name] = data.name  # ScatterND's output has its data input's shape
    return aliases


class OnnxRunner(NamedIORunner):
    """Runs ``model.onnx`` on ONNX Runtime: flat input leaves in, flat output tensors out.

    Args:
        path: the ``model.onnx`` file (its weights beside it in ``model.onnx.data``).
        providers: execution providers, in priority order (default CPU).
        io: ``input_leaves`` (the graph input name of each flattened input leaf, ``None`` for a leaf baked into
            the program) and ``output_leaves`` (the graph output name of each output leaf, ``None`` where
            ``output_constants`` gives its value; ``int_outputs`` are given back as ints), as written in the
            manifest's ``onnx`` section; its ``fusions``
            report's ``session_disabled_optimizers`` are left out of the session's graph optimizations; its
            ``in_place_outputs`` (``{output: input}``, :func:`in_place_outputs`) are written into their input's
            memory: such an input tensor is updated in place and returned as the output.
        session_options: an ``onnxruntime.SessionOptions``; the default logs errors only.
        data_path: the weights file; default ``model.onnx.data`` beside ``path`` when it exists.
        untrusted: the file comes from a loaded artifact: ONNX Runtime's ``ConstantFolding`` is left out, so that
            making the session computes nothing the file dictates (a 185-byte model whose ``ConstantOfShape``
            names a [16384, 16384] tensor took 5.6 s and 2 GiB to open with it, on onnxruntime 1.32). hfexport's
            exporter folded its constants already (onnxscript's optimizer).
        prepack: ONNX Runtime packs each constant ``MatMul`` weight for its GEMM kernels when the session opens
            (a second copy of those weights, in its own memory). ``False`` (the session an export verifies,
            :meth:`from_model`) leaves it out (``session.disable_prepacking``): the weights are read where ONNX
            Runtime maps them from the data file.

    Raises:
        OnnxSessionError: ONNX Runtime cannot create a session; names the node and op it refused.
    """

    program_file: ClassVar[str] = MODEL_FILE
    io_error: ClassVar[type[Exception]] = OnnxSessionError
    # The first decode loop on a session (reusing_bindings) moves the memory the session allocated when it opened
    # (its prepacked weights) into transparent huge pages where Linux allows it, on a background thread
    # (hfexport/memory.py); False: never.
    huge_pages: ClassVar[bool] = True

    def __init__(self, path: str | Path, providers: Sequence[str] = ("CPUExecutionProvider",),
                 io: Mapping[str, Any] | None = None, session_options: Any = None, *,
                 data_path: str | Path | None = None, untrusted: bool = False, model_bytes: bytes | None = None,
                 data_bytes: bytes | None = None, prepack: bool = True):
        self.providers = list(providers)
        self.untrusted, self.prepack = untrusted, prepack
        self.session_options = session_options
        # a loaded artifact's checked bytes (hfexport.trust.artifact_bytes): the session reads these, not the paths
        self.model_bytes, self.data_bytes = model_bytes, data_bytes
        if data_path is None and model_bytes is None:
            beside = Path(path).with_name(Path(path).name + ".data")
            data_path = beside if beside.exists() else None
        super().__init__(path, data_path, io=io)
        self.open()

    @classmethod
    def from_model(cls, model: ir.Model, providers: Sequence[str], io: Mapping[str, Any]) -> OnnxRunner:
        """Write ``model`` into a temporary directory owned by the runner and open a session on the file.

        Opening from a file (weights in ``model.onnx.data``) works past the 2 GB protobuf limit. The model's
        initializers become references to that file (memory-mapped), written one at a time (a lazy one, as the
        packed projections of ``_fusions.py``, computed as it is written), and the model is not to be changed
        afterwards.

        The session reads the weights where ONNX Runtime maps them from that file, unpacked (``prepack=False``):
        ONNX Runtime's packed copy of every ``MatMul`` weight, made when the session opens, held a second copy of
        the weights beside the exporting process's model (at Qwen2-0.5B's shapes, +2,396 MiB = 1.27x the weights
        at the open, the tied embedding's mapped pages included). A decode step costs the same without it (a
        2-layer model of Qwen2-0.5B's shapes on onnxruntime 1.32, one thread: 1.84 s against 1.86 s of CPU for 40
        tokens); a loaded artifact's session packs them.
        """

        with cls.temporary_directory("onnx") as directory:
            ir.external_data.unload_from_model(model, directory, DATA_FILE, size_threshold_bytes=256, max_workers=2)
            ir.save(model, directory / MODEL_FILE)  # the graph: its initializers are in the data file already
            data = directory / DATA_FILE
            return cls(directory / MODEL_FILE, providers, io, data_path=data if data.exists() else None,
                       prepack=False).owning(directory)

    def open(self) -> None:
        import onnxruntime

        options = self.session_options
        if options is None:
            options = onnxruntime.SessionOptions()
            options.log_severity_level = 3
        if not self.prepack:
            options.add_session_config_entry("session.disable_prepacking", "1")
        # ONNX Runtime's own fusions that would undo what hfexport's fusions left unfused for speed (_fusions.py)
        disabled = list((self.io.get("fusions") or {}).get("session_disabled_optimizers") or [])
        if self.untrusted:
            disabled.append("ConstantFolding")
        source: Any = str(self.path)
        if self.model_bytes is not None:
            source = self.model_bytes
            if self.data_bytes is not None and self.data_path is not None:
                import numpy as np

                self._data_array = np.frombuffer(self.data_bytes, dtype=np.uint8)  # alive as long as the session
                # external-data locations are relative to the model's folder; the checked ones are plain names
                options.add_external_initializers_from_files_in_memory(
                    [self.data_path.name], [self._data_array], [len(self.data_bytes)])
        # a session without prepacking (an export's verification) reads its weights from the mapped data file:
        # no packed copy of them to move into huge pages, so its mappings are not diffed
        collapse = self.huge_pages and self.prepack
        before = anonymous_mappings() if collapse else set()
        try:
            self.session = onnxruntime.InferenceSession(source, options, providers=self.providers,
                                                        disabled_optimizers=disabled or None)
        except Exception as exc:
            raise OnnxSessionError(_explain_session_failure(exc, self.path, self.providers)) from exc
        # what the session's creation mapped: its weights, prepacked (collapsed by the first reusing_bindings)
        self._session_memory = new_memory(before, anonymous_mappings()) if collapse else []
        self.huge_page_bytes: int | None = None  # set when the collapse has run
        self.bind_io([i.name for i in self.session.get_inputs()], [o.name for o in self.session.get_outputs()])
        # The floating dtype of each graph input: a floating input leaf is cast to it. A bfloat16 model computes in
        # float32 on ONNX Runtime's CPU (_fix_ir_bfloat16_as_float32): its bfloat16 inputs (as the model takes
        # them, and as the manifest says) are fed as float32 (numpy has no bfloat16: the feed raised "Got
        # unsupported ScalarType BFloat16"); its bfloat16 outputs come back as float32.
        types = {i.name: _ORT_FLOAT_TYPES.get(i.type) for i in self.session.get_inputs()}
        self.input_dtypes: list[torch.dtype | None] = [types.get(n) if n is not None else None
                                                       for n in self.input_leaves]

    def reset(self) -> None:
        """Nothing to reset: an ONNX Runtime session keeps no state between runs (a buffer the program mutates
        starts from its initializer on every run; d12 shows it)."""

    def run(self, args: tuple[Any, ...]) -> list[Any]:
        """Run the top-level inputs ``args`` (signature order; pytrees allowed); returns the flat outputs."""
        tensors = self.named_inputs(args, self.input_dtypes)  # a floating leaf cast to the graph's dtype
        feed = {name: tensor.numpy() for name, tensor in tensors.items()}
        names = [n for n in self.output_leaves if n is not None]
        aliases = {out: source for out, source in (self.io.get("in_place_outputs") or {}).items()
                   if source in feed and feed[source].flags.c_contiguous and feed[source].flags.writeable}
        if aliases:
            values = self._run_in_place(names, feed, tensors, aliases)
        else:
            values = {name: torch.from_numpy(v) for name, v in zip(names, self.session.run(names, feed), strict=True)}
        return self.flat_outputs(values)

    @contextlib.contextmanager
    def reusing_bindings(self) -> Iterator[None]:
        """Within the body, runs keep their IO binding: an input whose tensor is the same memory, shape and dtype as
        the previous run's is not bound again (a decode loop's cache, mask and step inputs, updated in place). The
        bound inputs stay referenced until the body ends.

        The first time on a session, the memory the session allocated when it opened (its prepacked weights: a
        decode step reads all of them) starts moving into transparent huge pages, on a background thread
        (:attr:`huge_pages`, ``hfexport/memory.py``); :attr:`huge_page_bytes` says how much did, once it is done."""
        if getattr(self, "_session_memory", None):
            ranges, self._session_memory = self._session_memory, []
            collapse_in_background(ranges, done=lambda collapsed: setattr(self, "huge_page_bytes", collapsed),
                                   name="hfexport-onnx-huge-pages")
        self._kept = (self.session.io_binding(), {})  # the binding, and per input: (memory key, its OrtValue)
        try:
            yield
        finally:
            self._kept = self._last_run = None
            self._rerun_bound = False

    def rerun(self) -> list[Any]:
        """Within :meth:`reusing_bindings`, after a run there: that run again on its bound inputs, whose tensors the
        caller updated in place (same memory, shapes and dtypes: a decode step's token, position, mask and cache);
        returns the flat outputs as :meth:`run` does, except that an output not written in place (the logits) is
        one buffer that each rerun overwrites: read it before the next. It skips what :meth:`run` repeats for
        unchanged inputs (flattening, the manifest's checks, binding lookups, a new output buffer): ~0.2 ms of
        Python per decode step, 10% of a step of a 58 M-parameter int4 decoder.

        Raises:
            RuntimeError: outside :meth:`reusing_bindings`, or before a run within it.
        """
        import onnxruntime

        last = getattr(self, "_last_run", None)
        if getattr(self, "_kept", None) is None or last is None:
            raise RuntimeError("OnnxRunner.rerun() repeats a run within reusing_bindings(); run once there first")
        binding = self._kept[0]
        names, aliases, tensors, values = last
        if not getattr(self, "_rerun_bound", False):  # the last run's outputs have the shapes a rerun's have
            values = {name: value if name in aliases else torch.empty_like(value) for name, value in values.items()}
            for name in names:
                if name not in aliases:
                    binding.bind_ortvalue_output(name, onnxruntime.OrtValue.ortvalue_from_numpy(values[name].numpy()))
            self._last_run, self._rerun_bound = (names, aliases, tensors, values), True
        self.session.run_with_iobinding(binding)
        return self.flat_outputs(values)

    def _run_in_place(self, names: list[str], feed: dict[str, Any], tensors: dict[str, torch.Tensor],
                      aliases: dict[str, str]) -> dict[str, torch.Tensor]:
        """One run through IO binding, each aliased output bound to its input's memory (no copy of the input)."""
        import onnxruntime

        kept = getattr(self, "_kept", None)
        binding, reused = kept if kept is not None else (self.session.io_binding(), None)
        rebound = {}
        for name, array in feed.items():
            tensor = tensors[name]
            key = (tensor.data_ptr(), tuple(tensor.shape), tensor.dtype)
            held = reused.get(name) if reused is not None else None
            if held is not None and held[0] == key:
                continue
            rebound[name] = onnxruntime.OrtValue.ortvalue_from_numpy(array)  # shares the array's memory
            binding.bind_ortvalue_input(name, rebound[name])
            if reused is not None:
                reused[name] = (key, rebound[name])
        for name in names:  # bound in this order on the first run: get_outputs() returns them so
            if name not in aliases:
                binding.bind_output(name, "cpu")  # a new buffer each run: a returned output is never overwritten
            elif aliases[name] in rebound:
                binding.bind_ortvalue_output(name, rebound[aliases[name]])
        self.session.run_with_iobinding(binding)
        produced = iter(binding.get_outputs())
        values = {}
        for name in names:
            value = next(produced)
            values[name] = tensors[aliases[name]] if name in aliases else torch.from_numpy(value.numpy())
        if kept is not None:
            self._last_run, self._rerun_bound = (names, aliases, tensors, values), False
        return values


def _explain_session_failure(exc: BaseException, path: Path, providers: Sequence[str]) -> str:
    """The ORT error, led by the node and op it refused (looked up in the model when ORT names only one)."""
    text = str(exc).strip()
    nodes: dict[str, tuple[str, str]] = {}
    with contextlib.suppress(Exception):
        model = ir.load(path)
        for graph in (model.graph, *model.functions.values()):
            for node in ir.traversal.RecursiveGraphIterator(graph):
                if node.name:
                    nodes[node.name] = (node.domain or "ai.onnx", node.op_type)
    culprit = None
    # ORT names the node like `Node (node_Foo_3)`, `node_Foo_3`, `[ShapeInferenceError] ... node: name` ...
    for match in re.finditer(r"[\"'(\s:=]([A-Za-z_][\w./:-]*)", text):
        if match.group(1) in nodes:
            culprit = match.group(1)
            break
    if culprit is None:  # an op that ORT does not know (it often names only the op)
        for name, (_domain, op_type) in nodes.items():
            if re.search(rf"\b{re.escape(op_type)}\b", text):
                culprit = name
                break
    where = "node ? (op ?)"
    if culprit is not None:
        domain, op_type = nodes[culprit]
        where = f"node {culprit!r} (op {op_type}, domain {domain})"
    first = text.splitlines()[0] if text else type(exc).__name__
    return f"ONNX Runtime ({', '.join(providers)}) cannot create a session for {path.name}: {where}: {first}"
