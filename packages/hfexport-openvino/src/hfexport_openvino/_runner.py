"""OpenVINORunner: ``openvino_model.xml`` (weights in ``openvino_model.bin``) compiled on OpenVINO's CPU plugin."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

from hfexport.plugin import NamedIORunner

__all__ = ["ALLOWED_CPU_PROPERTIES", "DATA_FILE", "MODEL_FILE", "OpenVINORunner", "compile_options"]

MODEL_FILE = "openvino_model.xml"
DATA_FILE = "openvino_model.bin"
DEVICE = "CPU"


# The CPU properties an artifact's manifest may set (``openvino.cpu_properties``), with their allowed values: the
# manifest is untrusted, and a property such as CACHE_DIR would make compile_model write or read files.
ALLOWED_CPU_PROPERTIES = {"SNIPPETS_MODE": ("DISABLE", "ENABLE", "IGNORE_CALLBACK")}


def compile_options(num_threads: int | None, cpu_properties: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The CPU plugin's properties of a runner: float32 inference (no bfloat16/float16 on CPUs that have it: the
    export is verified against float32 eager), ``INFERENCE_NUM_THREADS`` when given, and ``cpu_properties`` (the
    workarounds' properties the export recorded, e.g. ``{"SNIPPETS_MODE": "DISABLE"}``).

    Raises:
        ValueError: a property or value outside :data:`ALLOWED_CPU_PROPERTIES` (names it and what is allowed).
    """
    options: dict[str, Any] = {"INFERENCE_PRECISION_HINT": "f32"}
    if num_threads is not None:
        options["INFERENCE_NUM_THREADS"] = int(num_threads)
    for name, value in dict(cpu_properties or {}).items():
        if value not in ALLOWED_CPU_PROPERTIES.get(name, ()):
            raise ValueError(f"the manifest's openvino.cpu_properties sets {name}={value!r}; hfexport compiles with "
                             f"only {ALLOWED_CPU_PROPERTIES}")
        options[name] = value
    return options


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
            as the manifest's ``openvino`` section holds them.
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
        self.num_threads = num_threads if num_threads is not None else io.get("num_threads")
        self.cpu_properties = dict(io.get("cpu_properties") or {})
        compile_options(None, self.cpu_properties)  # a property outside the allowlist is refused before any read
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

                # OpenVINO shares only writeable memory: one copy of the checked bytes, which it then shares
                weights = np.frombuffer(bytearray(self.weights_bytes or b""), dtype=np.uint8)
                self._weights, self.weights_bytes = weights, None  # alive as long as the model
                model = core.read_model(self.model_bytes, openvino.Tensor(weights, shared_memory=True))
            else:
                model = core.read_model(str(self.path), str(self.data_path) if self.data_path else None)
            self.compiled = core.compile_model(model, DEVICE, compile_options(self.num_threads, self.cpu_properties))
        except Exception as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise RuntimeError(f"OpenVINO ({DEVICE}) cannot read or compile {self.path.name}: {first}") from exc
        # a compiled port may hold several tensor names (the CPU plugin keeps a fused node's), get_any_name()
        # one of them: a leaf is found by any (Gemma 3's scaled token embedding answered '3' for inputs_embeds)
        self.bind_io([port.get_any_name() for port in self.compiled.inputs],
                     [port.get_any_name() for port in self.compiled.outputs],
                     accepted={n for port in self.compiled.inputs for n in port.get_names()})
        self.request = self.compiled.create_infer_request()

    def reset(self) -> None:
        """Reset the OpenVINO variables (a stateful model's KV cache) to their initial values."""
        self.request.reset_state()

    def run(self, args: tuple[Any, ...]) -> list[Any]:
        """Run the top-level inputs ``args`` (signature order; pytrees allowed); returns the flat outputs."""
        feed = {name: tensor.numpy() for name, tensor in self.named_inputs(args).items()}
        results = self.request.infer(feed, share_inputs=True, share_outputs=False)
        return self.flat_outputs({name: value for port, value in results.items() for name in port.get_names()})
