"""OpenVINO benchmark: all-MiniLM-L6-v2 on OpenVINO's CPU plugin against eager PyTorch, ONNX Runtime and the peer's
OpenVINO export, all measured in this run.

Prints, for batch 1 x seq 128 and batch 8 x seq 128 at one thread (torch ``set_num_threads(1)``; ONNX Runtime 1
intra-op and 1 inter-op thread; OpenVINO ``INFERENCE_NUM_THREADS=1``): the median latency of N interleaved runs
after warm-up of each engine, its speed-up over eager, and its max abs diff of ``last_hidden_state`` against eager;
then each export's wall time (``dynamic=True``).

Engines: eager PyTorch; ``hfexport.export(..., backend="onnx", dynamic=True)`` on ONNX Runtime;
``hfexport.export(..., backend="openvino", dynamic=True, num_threads=1)``; the peer,
``transformers.exporters.OpenVINOExporter`` with ``OpenVINOConfig(dynamic=True)``, its compiled model recompiled with
``INFERENCE_NUM_THREADS=1``.

Run: HF_HUB_OFFLINE=1 uv run python benchmarks/bench_openvino.py [--runs 30] [--json out.json]
(This script may import the peer; the product never does.)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
import warnings
from pathlib import Path

os.environ["HF_HUB_OFFLINE"] = "1"


def interleaved(fns: dict, runs: int, warmup: int = 3) -> dict[str, float]:
    """Median seconds of each callable; the runs alternate so that every engine sees the same load."""
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(runs):
        for name, fn in fns.items():
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(t) for name, t in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    import openvino
    import torch

    import hfexport
    from hfexport_dynamo.demo import minilm_demo

    torch.set_num_threads(1)
    model, traced, _ = minilm_demo()
    engines, export_s = {}, {}

    start = time.perf_counter()
    onnx = hfexport.export(model, traced, backend="onnx", dynamic=True)
    export_s["hfexport onnx"] = time.perf_counter() - start
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads, options.inter_op_num_threads, options.log_severity_level = 1, 1, 3
    onnx.runner.session_options = options
    onnx.runner.open()
    start = time.perf_counter()
    ours = hfexport.export(model, traced, backend="openvino", dynamic=True, num_threads=1)
    export_s["hfexport openvino"] = time.perf_counter() - start
    peer = None
    try:
        from transformers.exporters.exporter_openvino import OpenVINOConfig, OpenVINOExporter

        start = time.perf_counter()
        peer = OpenVINOExporter().export(model, dict(traced), config=OpenVINOConfig(dynamic=True))
        export_s["peer openvino"] = time.perf_counter() - start
        peer_compiled = openvino.Core().compile_model(peer.program, "CPU", {"INFERENCE_NUM_THREADS": 1,
                                                                           "INFERENCE_PRECISION_HINT": "f32"})
    except Exception as error:  # noqa: BLE001 - reported, the other engines still run
        print(f"peer openvino: export failed: {type(error).__name__}: {str(error)[:300]}")

    results = {"load_average": os.getloadavg()[0], "export_s": export_s, "points": {}}
    for batch in (1, 8):
        inputs = {"input_ids": torch.randint(1000, 20000, (batch, 128), generator=torch.Generator().manual_seed(0)),
                  "token_type_ids": torch.zeros(batch, 128, dtype=torch.long),
                  "attention_mask": torch.ones(batch, 128, dtype=torch.long)}
        with torch.no_grad():
            reference = model(**inputs).last_hidden_state

        def eager(inputs=inputs):
            with torch.no_grad():
                return model(**inputs).last_hidden_state

        engines = {"eager": eager,
                   "hfexport onnx": lambda inputs=inputs: onnx(**inputs)["last_hidden_state"],
                   "hfexport openvino": lambda inputs=inputs: ours(**inputs)["last_hidden_state"]}
        if peer is not None:
            feed = {name: tensor.numpy() for name, tensor in inputs.items()}
            request = peer_compiled.create_infer_request()
            engines["peer openvino"] = lambda feed=feed, request=request: torch.from_numpy(
                request.infer(feed)[0].copy())
        diffs = {name: float((fn() - reference).abs().max()) for name, fn in engines.items()}
        medians = interleaved(engines, args.runs)
        point = results["points"][f"{batch}x128"] = {
            name: {"ms": medians[name] * 1e3, "speedup": medians["eager"] / medians[name], "max_abs_diff": diffs[name]}
            for name in engines}
        print(f"batch {batch} x 128, 1 thread, median of {args.runs} (load average {os.getloadavg()[0]:.1f}):")
        for name, row in point.items():
            print(f"  {name:18s} {row['ms']:8.2f} ms  {row['speedup']:5.2f}x eager  max abs diff {row['max_abs_diff']:.1e}")
    print("export s (dynamic=True): " + ", ".join(f"{name} {s:.1f}" for name, s in export_s.items()))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
