"""Export-time benchmark: where hfexport's export time goes, stage by stage, next to the peer's total.

For each backend, exports the real all-MiniLM-L6-v2 (the demo's bundled copy and its batch-2 example sentences)
with hfexport and with the peer ``transformers.exporters`` in the same process, interleaved so that both see the
same machine load, after one warm-up export of each (toolchain imports and first-call caches are not counted).
Prints the median of ``--runs`` wall times, their ratio (goal: hfexport / peer <= 0.8, issue 11), and hfexport's
breakdown from the manifest (``timings_s``: every stage, the toolchain steps inside them, the verification run
that ``export`` does by default, and the rest: input building, checks, packaging). hfexport is timed twice: as
users call it (``verify=True``, the default) and with ``verify=False``, which still runs the check but does not
raise (so the two differ only by noise); the peer verifies nothing.

Settings per backend (the same for both sides):
  * ``dynamo``: ``dynamic=True``;
  * ``onnx``: ``dynamic=True``; hfexport's default ONNX Runtime fusions, the peer's default (no fusions), and the
    peer with ``ort_fusions="cpu"`` as a third column;
  * ``executorch-xnnpack``: static shapes (the peer's dynamic MiniLM export plans gigabytes).

Run: uv run python benchmarks/bench_export_time.py [--backends dynamo onnx executorch-xnnpack] [--runs 3]
(This script may import the peer; the product never does.)
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
import warnings

os.environ["HF_HUB_OFFLINE"] = "1"

# backend -> (peer exporter class, peer config class, peer config options, hfexport export options)
SETTINGS = {
    "dynamo": ("DynamoExporter", "DynamoConfig", {"dynamic": True}, {"dynamic": True}),
    "onnx": ("OnnxExporter", "OnnxConfig", {"dynamic": True}, {"dynamic": True}),
    "executorch-xnnpack": ("ExecutorchExporter", "ExecutorchConfig", {"backend": "xnnpack", "dynamic": False},
                           {"dynamic": False}),
}


def peer_export(backend: str, model, inputs, **extra):
    import transformers.exporters as peer

    exporter, config, options, _ = SETTINGS[backend]
    return getattr(peer, exporter)().export(model, dict(inputs), getattr(peer, config)(**options, **extra))


def breakdown(manifest: dict) -> str:
    """``stage: seconds`` of an hfexport export, the toolchain steps nested in their stage."""
    timings = dict(manifest.get("timings_s") or {})
    return ", ".join(f"{name} {seconds:.2f}" for name, seconds in timings.items() if seconds >= 0.005)


def bench(backend: str, model, inputs, runs: int) -> None:
    import hfexport

    options = SETTINGS[backend][3]
    contenders = {
        "hfexport": lambda: hfexport.export(model, inputs, backend=backend, **options),
        "hfexport verify=False": lambda: hfexport.export(model, inputs, backend=backend, verify=False, **options),
        "peer": lambda: peer_export(backend, model, inputs),
    }
    if backend == "onnx":
        contenders["peer ort_fusions=cpu"] = lambda: peer_export(backend, model, inputs, ort_fusions="cpu")
    times: dict[str, list[float]] = {name: [] for name in contenders}
    manifests: list[dict] = []
    for fn in contenders.values():  # warm-up: toolchain imports and first-call caches
        fn()
    for _ in range(runs):
        for name, fn in contenders.items():
            start = time.perf_counter()
            result = fn()
            times[name].append(time.perf_counter() - start)
            if name == "hfexport":
                manifests.append(result.manifest)
    medians = {name: statistics.median(t) for name, t in times.items()}
    peer = medians["peer"]
    print(f"\n{backend} (MiniLM, {options}), median of {runs} after a warm-up:")
    for name, median in medians.items():
        spread = f"{min(times[name]):.2f}-{max(times[name]):.2f}"
        print(f"  {name:<24} {median:6.2f} s  (range {spread})  / peer {median / peer:.2f}")
    order = sorted(range(runs), key=lambda i: times["hfexport"][i])
    manifest = manifests[order[len(order) // 2]]
    timed = manifest.get("timings_s") or {}
    accounted = timed.get("total", 0.0) + timed.get("verification", 0.0)
    print(f"  hfexport breakdown of the median run: {breakdown(manifest)}; outside stages and verification "
          f"{times['hfexport'][order[len(order) // 2]] - accounted:.2f}")
    print(f"  goal hfexport / peer <= 0.8: {'met' if medians['hfexport'] / peer <= 0.8 else 'not met'}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backends", nargs="+", default=list(SETTINGS), choices=list(SETTINGS))
    parser.add_argument("--runs", type=int, default=3, help="timed exports per contender (default 3)")
    args = parser.parse_args()
    warnings.filterwarnings("ignore")

    import torch

    from hfexport_dynamo.demo import minilm_demo

    model, inputs, _ = minilm_demo()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, load average "
          f"{os.getloadavg()[0]:.1f} at start")
    for backend in args.backends:
        bench(backend, model, inputs, args.runs)


if __name__ == "__main__":
    main()
