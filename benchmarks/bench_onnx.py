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

With ``--fusions``, instead: ONNX Runtime fusions (``OnnxConfig(ort_fusions="cpu")``, hfexport's default) against
the unfused graph and against the peer with and without its ``OnnxConfig(ort_fusions="cpu")``, all exported in this
run (dynamic=True) and timed interleaved with eager PyTorch at batch 1 x seq 128 on one thread (torch 1 thread;
ORT 1 intra-op and 1 inter-op thread, no spinning, default graph optimizations; hfexport's fused model with the
session optimizers its manifest disables, as its runner opens it): median and min latency, speed-up over eager,
node count, fused ops, max abs diff of ``last_hidden_state`` against eager, export time. Goal: hfexport fused
>= 2.3x eager and faster than the peer with fusions.

Run: uv run python benchmarks/bench_onnx.py [--runs 30] [--export-runs 3] [--threads 1 2]
     uv run python benchmarks/bench_onnx.py --fusions [--runs 100]
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


GEMM_OPS_ORT = ("MatMul", "Gemm", "FusedMatMul")  # ONNX Runtime's dense matrix products (fused or not)
GEMM_OPS_TORCH = ("aten::addmm", "aten::mm", "aten::bmm", "aten::baddbmm")  # the kernels under Linear and matmul


def gemm_floor(model, feed, path: str, disabled, options, eager_s: float, runs: int) -> None:
    """The compute floor of the fused model: the time ONNX Runtime spends in its matrix products alone (its own
    profiler, per-node kernel times summed per run) and what eager PyTorch spends in its own (torch.profiler, self
    time of the GEMM kernels). No fusion removes a model's GEMMs, so ``eager / ORT GEMM time`` bounds the speed-up
    any fp32 graph of this model can reach on this CPU at this thread count."""
    import json

    import onnxruntime
    import torch

    profiled = onnxruntime.SessionOptions()
    for name in ("intra_op_num_threads", "inter_op_num_threads", "log_severity_level"):
        setattr(profiled, name, getattr(options, name))
    profiled.add_session_config_entry("session.intra_op.allow_spinning", "0")
    profiled.enable_profiling = True
    session = onnxruntime.InferenceSession(path, profiled, providers=["CPUExecutionProvider"],
                                           disabled_optimizers=disabled)
    feeds = {i.name: feed[i.name].numpy() for i in session.get_inputs()}
    for _ in range(3 + runs):  # the first 3 runs are the warm-up: their events are dropped below
        session.run(None, feeds)
    trace = session.end_profiling()
    with open(trace) as file:
        events = json.load(file)
    os.remove(trace)
    run_starts = sorted(e["ts"] for e in events if e.get("name") == "model_run")
    after_warmup = run_starts[3] if len(run_starts) > 3 else 0
    kernels = [e for e in events if e.get("cat") == "Node" and e.get("name", "").endswith("_kernel_time")
               and e["ts"] >= after_warmup]
    total = sum(e["dur"] for e in kernels) / runs / 1e6
    gemm = sum(e["dur"] for e in kernels if e.get("args", {}).get("op_name") in GEMM_OPS_ORT) / runs / 1e6
    with torch.no_grad(), torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        for _ in range(runs):
            model(**feed)
    torch_gemm = sum(e.self_cpu_time_total for e in prof.key_averages() if e.key in GEMM_OPS_TORCH) / runs / 1e6
    print(f"compute floor ({runs} profiled runs): ONNX Runtime kernels {total * 1e3:.2f} ms per run, of which GEMMs "
          f"({'/'.join(GEMM_OPS_ORT)}) {gemm * 1e3:.2f} ms; eager's GEMM kernels ({', '.join(GEMM_OPS_TORCH)}) "
          f"{torch_gemm * 1e3:.2f} ms of its {eager_s * 1e3:.2f} ms")
    print(f"  the most any fp32 graph on ONNX Runtime's GEMMs can reach: eager / ORT GEMM time = "
          f"{eager_s / gemm:.2f}x eager (GEMMs alone, every other op free)")


def fusion_comparison(model, tokenizer, inputs, runs: int) -> None:
    """The ``--fusions`` table: eager, hfexport unfused and fused, the peer unfused and fused (see the docstring)."""
    import collections

    import numpy as np
    import onnx
    import onnx_ir as ir
    import onnxruntime
    import torch
    from transformers.exporters import OnnxConfig as PeerConfig
    from transformers.exporters import OnnxExporter as PeerExporter

    import hfexport
    from hfexport_onnx._model import node_count

    torch.set_num_threads(1)
    exports, paths, disabled, seconds = {}, {}, {}, {}
    for name, make in (
            ("hfexport unfused", lambda: hfexport.export(model, inputs, backend="onnx", dynamic=True, ort_fusions=None)),
            ("hfexport fused", lambda: hfexport.export(model, inputs, backend="onnx", dynamic=True)),
            ("peer unfused", lambda: PeerExporter().export(model, dict(inputs), PeerConfig(dynamic=True))),
            ("peer ort_fusions=cpu", lambda: PeerExporter().export(model, dict(inputs),
                                                                   PeerConfig(dynamic=True, ort_fusions="cpu")))):
        start = time.perf_counter()
        exports[name] = make()
        seconds[name] = time.perf_counter() - start
        if name.startswith("hfexport"):
            paths[name] = str(exports[name].runner.path)
            disabled[name] = exports[name].manifest["onnx"]["fusions"]["session_disabled_optimizers"] or None
        else:  # the peer's program is an onnx_ir.Model: written where its runner would read it
            import atexit
            import shutil
            import tempfile

            folder = tempfile.mkdtemp(prefix="bench-onnx-peer-")
            atexit.register(shutil.rmtree, folder, ignore_errors=True)
            paths[name] = os.path.join(folder, "model.onnx")
            ir.save(exports[name].program, paths[name], external_data="model.onnx.data")
            disabled[name] = None
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    options.log_severity_level = 3
    sessions = {name: onnxruntime.InferenceSession(path, options, providers=["CPUExecutionProvider"],
                                                   disabled_optimizers=disabled[name])
                for name, path in paths.items()}
    feed = text_inputs(tokenizer, 1, 128)
    feeds = {name: {i.name: feed[i.name].numpy() for i in s.get_inputs()} for name, s in sessions.items()}
    with torch.no_grad():
        reference = model(**feed).last_hidden_state.numpy()
    calls = {"eager": lambda: model(**feed)}
    calls.update({name: (lambda s=s, f=feeds[name]: s.run(None, f)) for name, s in sessions.items()})
    for fn in calls.values():
        for _ in range(3):
            fn()
    times: dict = {name: [] for name in calls}
    with torch.no_grad():
        for _ in range(runs):
            for name, fn in calls.items():
                start = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - start)
    eager = statistics.median(times["eager"])
    eager_min = min(times["eager"])
    print(f"ONNX Runtime fusions, MiniLM batch 1 x seq 128, median (min) of {runs} interleaved runs; torch threads "
          f"{torch.get_num_threads()}, ORT intra-op {options.intra_op_num_threads} inter-op "
          f"{options.inter_op_num_threads}, spinning off, graph optimizations {options.graph_optimization_level.name}")
    print(f"{'':22s} {'ms':>7s} {'(min)':>7s} {'x eager':>8s} {'(min)':>6s} {'nodes':>6s} {'export s':>8s} "
          f"{'max diff':>8s}  fused ops in the file")
    print(f"{'eager (PyTorch)':22s} {eager * 1e3:7.2f} {eager_min * 1e3:7.2f} {1:8.2f} {1:6.2f}")
    for name, session in sessions.items():
        median, fastest = statistics.median(times[name]), min(times[name])
        output = session.run(None, feeds[name])[0]
        diff = float(np.abs(output - reference).max())
        proto = onnx.load(paths[name], load_external_data=False)
        nodes = [*proto.graph.node, *(n for f in proto.functions for n in f.node)]
        fused = collections.Counter(n.op_type for n in nodes if n.domain == "com.microsoft"
                                    or n.op_type == "SimplifiedLayerNormalization")
        count = node_count(ir.load(paths[name]))  # main graph, subgraphs and functions, as the manifest counts
        ops = ", ".join(f"{op} {k}" for op, k in sorted(fused.items())) or "-"
        session_note = f"; session without {', '.join(disabled[name])}" if disabled[name] else ""
        print(f"{name:22s} {median * 1e3:7.2f} {fastest * 1e3:7.2f} {eager / median:8.2f} {eager_min / fastest:6.2f} "
              f"{count:6d} {seconds[name]:8.1f} {diff:8.1e}  {ops}{session_note}")
    gemm_floor(model, feed, paths["hfexport fused"], disabled["hfexport fused"], options, eager, runs)
    ours = statistics.median(times["hfexport fused"])
    peer = statistics.median(times["peer ort_fusions=cpu"])
    print(f"goal: hfexport fused >= 2.3x eager: {eager / ours:.2f}x ({'met' if eager / ours >= 2.3 else 'not met'}); "
          f"faster than the peer with fusions: {peer / ours:.2f}x its speed "
          f"({'met' if ours < peer else 'not met'})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=30, help="latency runs per shape (median; >= 20)")
    parser.add_argument("--export-runs", type=int, default=3, help="export runs per exporter (median)")
    parser.add_argument("--threads", type=int, nargs="+", default=sorted({1, os.cpu_count() or 1}),
                        help="intra-op thread counts to measure, the same for both runtimes (default: 1 and all "
                             "cores; on a shared machine the 1-thread figures are the stable ones)")
    parser.add_argument("--fusions", action="store_true",
                        help="only the ONNX Runtime fusions table (hfexport and the peer, fused and unfused)")
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
    if args.fusions:
        fusion_comparison(model, tokenizer, inputs, args.runs)
        return

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
