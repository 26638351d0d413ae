"""ONNX benchmark: all-MiniLM-L6-v2 on ONNX Runtime against eager PyTorch, and the export against the peer.

Prints, measured in this run:
  * inference latency of MiniLM (``last_hidden_state`` + ``pooler_output``) on ONNX Runtime (the
    ``hfexport.export(..., backend="onnx", dynamic=True)`` artifact, CPUExecutionProvider) and in eager
    PyTorch, at batch 1 x seq 128 and batch 8 x seq 128, median of N interleaved runs after warm-up, and the
    speed-up (goal: ORT >= 1.5x faster at batch 1); both runtimes use the same thread count, measured at 1
    thread and at all cores (other load on the machine stalls multi-threaded eager far more than ORT);
  * export wall time (dynamic=True) with hfexport and with the peer ``transformers.exporters.OnnxExporter``,
    interleaved, median of M runs, and their ratio;
  * the ONNX node count of both exports (main graph, subgraphs and functions).

Run: uv run python benchmarks/bench_onnx.py [--runs 30] [--export-runs 3] [--threads 1 2]
(This script may import the peer; the product never does.)
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
import warnings

os.environ["HF_HUB_OFFLINE"] = "1"


def interleaved_latency(fns: dict, runs: int, warmup: int = 3) -> dict:
    """Median seconds of each callable; runs alternate so that every callable sees the same machine load."""
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    times: dict = {name: [] for name in fns}
    for _ in range(runs):
        for name, fn in fns.items():
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(t) for name, t in times.items()}


def text_inputs(tokenizer, batch: int, seq: int) -> dict:
    words = "hfexport turns models into artifacts and runs them back on their runtime".split()
    sentences = [" ".join(words[(i + j) % len(words)] for j in range(4 * seq)) for i in range(batch)]
    return dict(tokenizer(sentences, padding="max_length", truncation=True, max_length=seq, return_tensors="pt"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=30, help="latency runs per shape (median; >= 20)")
    parser.add_argument("--export-runs", type=int, default=3, help="export runs per exporter (median)")
    parser.add_argument("--threads", type=int, nargs="+", default=sorted({1, os.cpu_count() or 1}),
                        help="intra-op thread counts to measure, the same for both runtimes (default: 1 and all "
                             "cores; on a shared machine the 1-thread figures are the stable ones)")
    args = parser.parse_args()

    import onnxruntime
    import torch
    from transformers import AutoTokenizer
    from transformers.exporters import OnnxConfig as PeerConfig
    from transformers.exporters import OnnxExporter as PeerExporter

    import hfexport
    from hfexport_dynamo.demo import minilm_demo, minilm_path
    from hfexport_onnx.exporter_onnx import OnnxRunner, node_count

    warnings.filterwarnings("ignore")
    model, inputs, _ = minilm_demo()
    tokenizer = AutoTokenizer.from_pretrained(minilm_path())
    print(f"MiniLM (all-MiniLM-L6-v2); torch {torch.__version__}, onnxruntime {onnxruntime.__version__}, "
          f"{os.cpu_count()} CPU cores")

    # ── export time and node count, interleaved (torch's default threads) ─────────────────────────────
    ours_s, peer_s, ours, peer = [], [], None, None
    for _ in range(args.export_runs):
        start = time.perf_counter()
        ours = hfexport.export(model, inputs, backend="onnx", dynamic=True)
        ours_s.append(time.perf_counter() - start)
        start = time.perf_counter()
        peer = PeerExporter().export(model, dict(inputs), PeerConfig(dynamic=True))
        peer_s.append(time.perf_counter() - start)
    o, p = statistics.median(ours_s), statistics.median(peer_s)
    print(f"export (dynamic=True), median of {args.export_runs}: hfexport {o:.2f} s, peer "
          f"transformers.exporters.OnnxExporter {p:.2f} s, ratio {o / p:.2f}")
    print(f"ONNX nodes: hfexport {ours.manifest['onnx']['node_count']} (optimized="
          f"{ours.manifest['onnx']['optimized']}), peer {node_count(peer.program)}")

    # ── latency: ORT (our artifact) vs eager, at each thread count ─────────────────────────────────────
    names = ours.input_names
    for threads in args.threads:
        torch.set_num_threads(threads)
        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = threads
        options.log_severity_level = 3
        runner = OnnxRunner(ours.runner.path, ["CPUExecutionProvider"], ours.manifest["onnx"], options)
        for batch, seq in ((1, 128), (8, 128)):
            feed = text_inputs(tokenizer, batch, seq)
            args_ = tuple(feed[n] for n in names)
            with torch.no_grad():
                medians = interleaved_latency({"eager": lambda: model(**feed),  # noqa: B023
                                               "ort": lambda: runner.run(args_)}, args.runs)  # noqa: B023
                diff = (runner.run(args_)[0] - model(**feed).last_hidden_state).abs().max().item()
            eager, ort = medians["eager"], medians["ort"]
            goal = " (goal >= 1.5x)" if batch == 1 else ""
            print(f"latency {threads} thread(s), batch {batch} x seq {seq}, median of {args.runs}: ORT "
                  f"{ort * 1e3:.2f} ms, eager {eager * 1e3:.2f} ms, speed-up {eager / ort:.2f}x{goal}; "
                  f"max abs diff {diff:.1e}")


if __name__ == "__main__":
    main()
