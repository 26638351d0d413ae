"""OpenVINORunner: ``openvino_model.xml`` (weights in ``openvino_model.bin``) compiled on OpenVINO's CPU plugin."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

from hfexport.plugin import NamedIORunner

from ._graph import INPUT_MUTATION

__all__ = ["ALLOWED_CPU_PROPERTIES", "DATA_FILE", "INFERENCE_PRECISIONS", "KV_CACHE_PRECISIONS", "MODEL_FILE",
           "OpenVINORunner", "compile_options"]

MODEL_FILE = "openvino_model.xml"
DATA_FILE = "openvino_model.bin"
DEVICE = "CPU"


# The CPU properties an artifact's manifest may set (``openvino.cpu_properties``), with their allowed values: the
# manifest is untrusted, and a property such as CACHE_DIR would make compile_model write or read files.
ALLOWED_CPU_PROPERTIES = {"SNIPPETS_MODE": ("DISABLE", "ENABLE", "IGNORE_CALLBACK")}
INFERENCE_PRECISIONS = ("f32", "bf16", "f16")  # INFERENCE_PRECISION_HINT
KV_CACHE_PRECISIONS = ("f32", "f16", "bf16", "u8")  # KV_CACHE_PRECISION (a growing cache, fused by the plugin)


def compile_options(num_threads: int | None, cpu_properties: Mapping[str, Any] | None = None,
                    inference_precision: str = "f32", kv_cache_precision: str = "f32") -> dict[str, Any]:
    """The CPU plugin's properties of a runner: ``INFERENCE_PRECISION_HINT`` and ``KV_CACHE_PRECISION`` (float32 by
    default, not the plugin's bfloat16/float16 on CPUs that have them: the export is verified against float32
    eager), ``INFERENCE_NUM_THREADS`` when given, and ``cpu_properties`` (the workarounds' properties the export
    recorded, e.g. ``{"SNIPPETS_MODE": "DISABLE"}``).

    Raises:
        ValueError: a property or value outside :data:`ALLOWED_CPU_PROPERTIES`, :data:`INFERENCE_PRECISIONS` or
            :data:`KV_CACHE_PRECISIONS` (names it and what is allowed).
    """
    if inference_precision not in INFERENCE_PRECISIONS or kv_cache_precision not in KV_CACHE_PRECISIONS:
        raise ValueError(f"the manifest's openvino precisions {inference_precision!r}/{kv_cache_precision!r} are not "
                         f"among {INFERENCE_PRECISIONS}/{KV_CACHE_PRECISIONS}")
    options: dict[str, Any] = {"INFERENCE_PRECISION_HINT": inference_precision,
                               "KV_CACHE_PRECISION": kv_cache_precision}
    if num_threads is not None:
        options["INFERENCE_NUM_THREADS"] = int(num_threads)
    for name, value in dict(cpu_properties or {}).items():
        if value not in ALLOWED_CPU_PROPERTIES.get(name, ()):
            raise ValueError(f"the manifest's openvino.cpu_properties sets {name}={value!r}; hfexport compiles with "
                             f"only {ALLOWED_CPU_PROPERTIES}")
        options[name] = value
    return options


# OpenVINO element types (``Type.get_type_name()``) of floating ports, as torch dtypes
_TORCH_DTYPES = {"f32": "float32", "bf16": "bfloat16", "f16": "float16", "f64": "float64"}


def as_openvino(tensor: Any) -> Any:
    """A CPU tensor as OpenVINO takes it: a numpy array sharing its memory, or for a bfloat16 tensor (numpy has no
    bfloat16) an ``openvino.Tensor`` of type ``bf16`` holding its bytes."""
    import torch

    if tensor.dtype != torch.bfloat16:
        return tensor.numpy()
    import openvino

    # OpenVINO's Python API shows a bf16 tensor's data as a float16 array of the same bytes
    # (openvinotoolkit/openvino#23263, closed unmerged): the bytes are written through that view
    out = openvino.Tensor(openvino.Type.bf16, openvino.Shape(list(tensor.shape)))
    out.data[...] = tensor.contiguous().view(torch.int16).numpy().view("float16")
    return out


def as_torch(value: Any, element_type: Any) -> Any:
    """An OpenVINO result (a numpy array) of ``element_type`` as a torch tensor sharing its memory; a ``bf16`` one
    is a float16 array holding bfloat16 bytes (openvinotoolkit/openvino#23263), read back as bfloat16: taken for
    float16 values, e05's bfloat16 logits 2.375 read 2.047 (a max error of 1.38)."""
    import numpy as np
    import torch

    if not isinstance(value, np.ndarray):
        return value
    tensor = torch.from_numpy(value)
    if element_type.get_type_name() == "bf16":
        return tensor.contiguous().view(torch.bfloat16)
    return tensor


class OpenVINORunner(NamedIORunner):
    """Runs ``openvino_model.xml`` on OpenVINO's CPU plugin: flat input leaves in, flat output tensors out.

    The IR is read once (``openvino.Core().read_model(xml, bin)``) and that parsed model is compiled
    (``compile_model(model, "CPU")``).

    Args:
        path: the ``openvino_model.xml`` file.
        data_path: its weights; default ``openvino_model.bin`` beside it.
        io: ``input_leaves`` / ``output_leaves`` (the model's input and output name per flattened leaf, ``None`` for
            a leaf baked into the program), ``output_constants``, ``int_outputs``, ``num_threads`` (``INFERENCE_NUM_THREADS``)
            and ``cpu_properties`` (more properties of ``compile_model``, within :data:`ALLOWED_CPU_PROPERTIES`),
            ``inference_precision`` / ``kv_cache_precision`` (:func:`compile_options`) and ``growing_states``
            (``{variable: {"input": name, "output": name}}``: the cache inputs and outputs the IR keeps as
            variables, ``_graph.make_growing_stateful``), as the manifest's ``openvino`` section holds them.
        num_threads: overrides ``io["num_threads"]``.
        untrusted: the file comes from a loaded artifact: checked by ``_untrusted.check_ir_file`` first (done by
            ``OpenVINOExporter.load_runner``, which sets it).

    Raises:
        RuntimeError: OpenVINO cannot read or compile the IR (its message, with the file's name).
    """

    program_file: ClassVar[str] = MODEL_FILE

    def __init__(self, path: str | Path, data_path: str | Path | None = None, *, io: Mapping[str, Any] | None = None,
                 num_threads: int | None = None, untrusted: bool = False, model_bytes: bytes | None = None,
                 weights_bytes: bytes | None = None):
        io = dict(io or {})
        # a loaded artifact's checked bytes (hfexport.trust.artifact_bytes): OpenVINO reads these, not the paths
        self.model_bytes, self.weights_bytes = model_bytes, weights_bytes
        self._weights = None  # the writable copy OpenVINO shares, made by the first open()
        self.num_threads = num_threads if num_threads is not None else io.get("num_threads")
        self.cpu_properties = dict(io.get("cpu_properties") or {})
        self.precisions = (str(io.get("inference_precision", "f32")), str(io.get("kv_cache_precision", "f32")))
        self.growing_states: dict[str, dict[str, str]] = dict(io.get("growing_states") or {})
        # a property outside the allowlist is refused before any read
        compile_options(None, self.cpu_properties, *self.precisions)
        self.untrusted = untrusted
        if data_path is None and model_bytes is None:
            beside = Path(path).with_name(DATA_FILE)
            data_path = beside if beside.exists() else None
        super().__init__(path, data_path, io=io)
        self.open()

    def open(self) -> None:
        import openvino

        core = openvino.Core()
        try:
            if self.model_bytes is not None:
                import numpy as np

                # OpenVINO shares only writeable memory: one copy of the checked bytes, made on the first open and
                # shared by every later one (a reopen with other threads found the bytes dropped: "Incorrect
                # weights in bin file!")
                if self._weights is None:
                    self._weights = np.frombuffer(bytearray(self.weights_bytes or b""), dtype=np.uint8)
                    self.weights_bytes = None  # the copy above is the one kept, alive as long as the runner
                model = core.read_model(self.model_bytes, openvino.Tensor(self._weights, shared_memory=True))
            else:
                model = core.read_model(str(self.path), str(self.data_path) if self.data_path else None)
            self.compiled = core.compile_model(model, DEVICE, compile_options(self.num_threads, self.cpu_properties,
                                                                              *self.precisions))
        except Exception as exc:
            # OpenVINO's message: "Exception from <file>:<line>:" per frame, then the check and its reason (c01:
            # "Unexpected: CPU plug-in doesn't support Tile operation with dynamic rank"): the reason is kept
            lines = [line.strip() for line in str(exc).strip().splitlines() if line.strip()]
            reason = [line for line in lines if not line.startswith("Exception from ")] or lines
            said = reason[-1] if reason else type(exc).__name__
            raise RuntimeError(f"OpenVINO ({DEVICE}) cannot read or compile {self.path.name}: {said}") from exc
        # a compiled port may hold several tensor names (the CPU plugin keeps a fused node's), get_any_name()
        # one of them: a leaf is found by any (Gemma 3's scaled token embedding answered '3' for inputs_embeds)
        kept = {s["input"] for s in self.growing_states.values()}  # inputs the IR keeps as variables
        self.bind_io([port.get_any_name() for port in self.compiled.inputs],
                     [port.get_any_name() for port in self.compiled.outputs],
                     accepted={n for port in self.compiled.inputs for n in port.get_names()} | kept)
        # a floating leaf is cast to its port's type (a bfloat16 model's tensors fed as float32, and the reverse)
        import torch

        port_dtypes = {name: getattr(torch, _TORCH_DTYPES.get(port.get_element_type().get_type_name(), ""), None)
                       for port in self.compiled.inputs for name in port.get_names()}
        self.input_dtypes = [port_dtypes.get(name) if name is not None else None for name in self.input_leaves]
        self.request = self.compiled.create_infer_request()
        self.beam_idx = any("beam_idx" in port.get_names() for port in self.compiled.inputs)
        self.logits_port = next((port for port in self.compiled.outputs if "logits" in port.get_names()), None)

    def reset(self) -> None:
        """Reset the OpenVINO variables (a stateful model's KV cache) to their initial values."""
        self.request.reset_state()

    def run(self, args: tuple[Any, ...]) -> list[Any]:
        """Run the top-level inputs ``args`` (signature order; pytrees allowed); returns the flat outputs."""
        feed = {name: as_openvino(tensor) for name, tensor in self.named_inputs(args, self.input_dtypes).items()}
        if not self.growing_states:
            results = self.request.infer(feed, share_inputs=True, share_outputs=False)
            values = {name: as_torch(value, port.get_element_type()) for port, value in results.items()
                      for name in port.get_names()}
            self.write_back_input_mutations(args, values)
            return self.flat_outputs(values)
        import openvino

        # a growing cache: its inputs set the variables, its outputs are the variables after the call
        self.request.reset_state()
        states = {state.name: state for state in self.request.query_state()}
        for variable, names in self.growing_states.items():
            value = feed.pop(names["input"])
            states[variable].state = value if isinstance(value, openvino.Tensor) else openvino.Tensor(value.copy())
        results = self.request.infer(self._with_beam_idx(feed), share_inputs=True, share_outputs=False)
        values = {name: as_torch(value, port.get_element_type()) for port, value in results.items()
                  for name in port.get_names()}
        states = {state.name: state for state in self.request.query_state()}
        for variable, names in self.growing_states.items():
            state = states[variable].state
            values[names["output"]] = as_torch(state.data.copy(), state.get_element_type())
        return self.flat_outputs(values)

    def write_back_input_mutations(self, args: tuple[Any, ...], values: Mapping[str, Any]) -> None:
        """Copy each ``input_mutation.<input leaf>`` output into the caller's input tensor of that leaf, as eager
        ``forward`` changes an input it mutates in place (a cache's conv state updated with ``copy_``: LFM2)."""
        mutations = {name[len(INPUT_MUTATION):]: value for name, value in values.items()
                     if name.startswith(INPUT_MUTATION)}
        if not mutations:
            return
        import torch
        import torch.utils._pytree as pytree

        for leaf, name in zip(pytree.tree_leaves(tuple(args)), self.input_leaves, strict=False):
            value = mutations.get(name) if name is not None else None
            if value is not None and isinstance(leaf, torch.Tensor):
                new = torch.as_tensor(value)
                if new.shape == leaf.shape:
                    with torch.no_grad():
                        leaf.copy_(new)

    def run_keeping_cache(self, inputs: Mapping[str, Any]) -> Any:
        """One call of a generation program whose growing cache the IR keeps (``growing_states``): ``inputs`` are
        ``{name: int64 tensor}`` of its other inputs (``input_ids``, ``attention_mask``, ``position_ids``); the
        cache is the variables' from the last call (empty after :meth:`reset`). Returns ``logits`` ``float32
        [batch, seq, vocab]``.

        Raises:
            RuntimeError: the IR keeps no growing cache.
        """
        import numpy as np

        if self.logits_port is None or not self.growing_states:
            raise RuntimeError(f"{self.path.name} keeps no growing cache (export with kv_cache='growing')")
        feed = {name: np.ascontiguousarray(tensor.numpy()) for name, tensor in inputs.items()}  # int64 ids
        self.request.infer(self._with_beam_idx(feed), share_inputs=True)
        logits = self.request.get_tensor(self.logits_port)
        return as_torch(logits.data.copy(), logits.get_element_type())

    def _with_beam_idx(self, feed: dict[str, Any]) -> dict[str, Any]:
        """``feed`` with ``beam_idx`` ``arange(batch)`` (each row keeps its own cache) where the IR takes one."""
        import numpy as np

        if self.beam_idx and "beam_idx" not in feed:  # (the first input's batch: a numpy array or openvino.Tensor)
            feed["beam_idx"] = np.arange(tuple(next(iter(feed.values())).shape)[0], dtype=np.int32)
        return feed
