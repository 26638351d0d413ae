"""Where a decode step's time goes, op by op: hfexport's ExecuTorch (XNNPACK) program against its ONNX Runtime one.

The generation benchmark (``bench_generation.py``) times whole decode steps; this script says which ops make the
difference between two runtimes at the same step. It exports the seeded model of ``bench_generation.py`` for each
backend (or reuses ``--exports DIR``), loads each artifact in this process with the runtime's own profiler on, and
runs ``generate`` so that ``--steps`` decode steps fall near each ``--positions`` entry (cached positions):
  * ExecuTorch: ETDump (``Runtime.load_program(..., enable_etdump=True)``), read with ``executorch.devtools.Inspector``:
    every XNNPACK op inside the delegates (the pip wheel is built with XNNPACK's runtime profiling), every portable or
    custom kernel (``llama::custom_sdpa``, ``llama::update_cache``), the delegate and operator call overheads;
  * ONNX Runtime: ``SessionOptions.enable_profiling``: every node's kernel time, by op type;
  * ``ort-genai``: ONNX Runtime GenAI's own loop on its model builder's fp32 graph (``benchmarks/_anchors.py``),
    with the same profiler switched on in its ``genai_config.json`` (needs ``--group bench``).
A decode step's wall time (``step (wall)``) is also given where the loop reports it: its part outside the session
run is the ``host loop`` (the Python of hfexport's ``generate``; GenAI's C++ loop).
Times are per decode step (median over the steps), in ms, one thread. The ops are grouped by what they compute
(matmul / linear, attention, cache update, norm, elementwise, data movement, dispatch overhead) so that the two
runtimes' rows line up, and each op type is listed beside its group.

Run: HF_HUB_OFFLINE=1 uv run python benchmarks/profile_decode_ops.py [--size toy|small|0.5b] [--positions 64 1000]
     [--steps 8] [--backends executorch-xnnpack onnx ort-genai] [--exports DIR] [--threads 1]
"""

from __future__ import annotations

import argparse
import bisect
import collections
import json
import os
import re
import statistics
import sys
import tempfile
import warnings
from pathlib import Path

os.environ["HF_HUB_OFFLINE"] = "1"
sys.path.insert(0, str(Path(__file__).parent))

import bench_generation as bench  # noqa: E402 - the seeded models

# What each runtime's op computes, so that both runtimes' rows line up (first match wins).
GROUPS: tuple[tuple[str, str], ...] = (
    ("attention", r"sdpa|Attention|Softmax"),
    ("cache update", r"update_cache|index_put|ScatterND|KVCache"),
    ("matmul / linear", r"Fully Connected|MatMul|Gemm|Batch Matrix Multiply|bmm|mm\.out|linear|addmm"),
    ("norm", r"mean|Mean \(|Reciprocal Square Root|Square \(|LayerNorm|SimplifiedLayerNormalization|RMSNorm|Pow|Sqrt|ReduceMean"),
    ("rotary", r"Rotary|Cosine|Sine"),
    ("embedding / gather", r"embedding|Gather"),
    ("data movement", r"copy|Copy|Transpose|Reshape|Concat|cat\.out|Slice|Split|Unsqueeze|Squeeze|Expand|Tile|view|select|permute|Cast|dim_order|Shape"),
    ("elementwise", r"Multiply|Add|Subtract|Divide|Negate|Sigmoid|Mul|Sub|Div|Neg|Silu|QuickGelu|Where|Clamp|Max|Min|Equal|Less|Greater|And|Not|Range"),
)
OVERHEAD = "dispatch overhead"
HOST = "overhead: host loop"  # a decode step's wall time outside the session run (the loop's own code)


def group_of(op: str) -> str:
    if op == HOST:
        return "host loop"
    if op.startswith("overhead"):
        return OVERHEAD
    for group, pattern in GROUPS:
        if re.search(pattern, op):
            return group
    return "other"


def export_if_missing(backend: str, model, out: Path, max_cache_len: int) -> Path:
    import hfexport

    if not (out / "export.json").exists():
        print(f"exporting {backend} to {out} ...", flush=True)
        exported = hfexport.export(model, backend=backend, task="text-generation", max_cache_len=max_cache_len)
        exported.save_pretrained(out)
    return out


def convert_if_missing(model, root: Path) -> Path:
    """ONNX Runtime GenAI's fp32 conversion of ``model`` (its model builder, ``benchmarks/_anchors.py``), kept in
    ``root / "ort-genai"``."""
    import _anchors

    out = root / "ort-genai"
    if not (out / "genai_config.json").exists():
        print(f"converting with ONNX Runtime GenAI's model builder to {out} ...", flush=True)
        hf_dir = root / "hf"
        model.save_pretrained(hf_dir)
        _anchors.convert("ort-genai", str(hf_dir), str(out), "fp32")
    return out


def decode_plan(positions: list[int], steps: int) -> list[tuple[int, int]]:
    """(prompt length, new tokens) per position: the last ``steps`` decode steps start ``steps // 2`` before it."""
    return [(max(2, p - steps // 2), steps + 1) for p in positions]


def run_plan(exported, plan: list[tuple[int, int]], vocab: int, walls: list[list[float]] | None = None
             ) -> list[tuple[int, int]]:
    """Generate each plan entry; per entry, (program runs of its prefill, of its decode): the prefill runs in
    chunks of the manifest's ``prefill_chunk`` tokens, then one run per decode step. ``walls`` gets each entry's
    decode steps' wall seconds (``generation_stats["decode_step_s"]``)."""
    import math

    import torch

    chunk, runs = exported.manifest["generation"]["prefill_chunk"], []
    for prompt, new in plan:
        ids = torch.arange(prompt).remainder(vocab - 3).add(3).unsqueeze(0)
        exported.generate(ids, max_new_tokens=new, eos_token_id=None)
        runs.append((math.ceil(prompt / chunk), exported.generation_stats["decode_steps"]))
        if walls is not None:
            walls.append(list(exported.generation_stats["decode_step_s"]))
    return runs


# ── ExecuTorch: ETDump ────────────────────────────────────────────────────────────────────────────────────────
def profile_executorch(path: Path, plan: list[tuple[int, int]], vocab: int
                       ) -> tuple[list[dict[str, float]], list[tuple[int, int]]]:
    """Per program execution (in order): op -> ms, from the ETDump of every ``Method::execute``; and
    :func:`run_plan`'s runs."""
    from executorch.devtools import Inspector
    from executorch.runtime import Runtime

    import hfexport

    programs = []
    original = Runtime.load_program

    def load_program(self, data, *, data_path=None, verification=None, **_):
        options = {"data_path": data_path, "enable_etdump": True}
        if verification is not None:
            options["verification"] = verification
        program = original(self, data, **options)
        programs.append(program)
        return program

    Runtime.load_program = load_program
    try:
        exported = hfexport.load(path)
        calls = run_plan(exported, plan, vocab)
    finally:
        Runtime.load_program = original
    with tempfile.TemporaryDirectory() as tmp:
        etdump = os.path.join(tmp, "decode.etdp")
        programs[-1].write_etdump_result_to_file(etdump, os.path.join(tmp, "debug.bin"))
        inspector = Inspector(etdump_path=etdump)
    block = next(b for b in inspector.event_blocks if b.name == "Execute")
    runs = len(next(e for e in block.events if e.name == "Method::execute").perf_data.raw)
    per_run: list[collections.Counter] = [collections.Counter() for _ in range(runs)]
    pending_delegated: list[float] | None = None
    pending_native: list[float] | None = None
    for event in block.events:
        if not event.perf_data:
            continue
        raw, name = event.perf_data.raw, re.sub(r" #\d+$", "", event.name)
        if event.is_delegated_op:  # an XNNPACK op inside the next DELEGATE_CALL
            pending_delegated = [a + b for a, b in zip(pending_delegated or [0.0] * runs, raw, strict=True)]
            for k in range(runs):
                per_run[k][name] += raw[k]
        elif name == "DELEGATE_CALL":
            inner = pending_delegated or [0.0] * runs
            for k in range(runs):
                per_run[k]["overhead: delegate call"] += max(0.0, raw[k] - inner[k])
            pending_delegated = None
        elif name == "OPERATOR_CALL":
            inner = pending_native or [0.0] * runs
            for k in range(runs):
                per_run[k]["overhead: operator call"] += max(0.0, raw[k] - inner[k])
            pending_native = None
        elif name == "Method::execute":
            for k in range(runs):
                per_run[k]["total"] += raw[k]
        else:  # a portable or custom kernel (native_call_*, llama::*), inside the next OPERATOR_CALL
            pending_native = raw
            for k in range(runs):
                per_run[k][name.removeprefix("native_call_")] += raw[k]
    return [dict(c) for c in per_run], calls


# ── ONNX Runtime: its profiler ──────────────────────────────────────────────────────────────────────────────
def profile_onnx(path: Path, plan: list[tuple[int, int]], vocab: int, threads: int
                 ) -> tuple[list[dict[str, float]], list[tuple[int, int]]]:
    """Per session run (in order): op type -> ms, from ONNX Runtime's profile; and :func:`run_plan`'s runs. A
    decode run's ``wall`` is its step's wall time in ``generate`` (the loop's Python and the session run)."""
    import onnxruntime

    import hfexport

    exported = hfexport.load(path)
    walls: list[list[float]] = []
    with tempfile.TemporaryDirectory() as tmp:
        runner = exported.components["decoder"].runner
        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
        options.log_severity_level = 3
        options.enable_profiling, options.profile_file_prefix = True, os.path.join(tmp, "ort")
        runner.session_options = options
        runner.open()
        calls = run_plan(exported, plan, vocab, walls)
        events = json.loads(Path(runner.session.end_profiling()).read_text())
    per_run = ort_profile_runs(events)
    add_walls(per_run, calls, walls)
    return per_run, calls


def add_walls(per_run: list[dict[str, float]], calls: list[tuple[int, int]], walls: list[list[float]]) -> None:
    """Each decode run's ``wall`` (ms, from ``walls``: per plan entry, its decode steps' seconds) and the host's
    share of it outside the session run (``overhead: host loop``)."""
    index = 0
    for (prefill, decode), steps in zip(calls, walls, strict=True):
        index += prefill
        for run, wall in zip(per_run[index:index + decode], steps, strict=False):
            run["wall"] = wall * 1e3
            run["overhead: host loop"] = max(0.0, wall * 1e3 - run.get("total", 0.0))
        index += decode


def profile_ort_genai(path: Path, plan: list[tuple[int, int]], vocab: int, threads: int
                      ) -> tuple[list[dict[str, float]], list[tuple[int, int]]]:
    """ONNX Runtime GenAI's own loop (``og.Generator``, ``benchmarks/_anchors.py``) on its model builder's graph
    (``path``: a converted folder), with ONNX Runtime's profiler on through ``genai_config.json``'s
    ``session_options.enable_profiling`` (a file prefix): per session run, op type -> ms; the prompt is one run,
    then one run per decode step; a decode run's ``wall`` is the time between two tokens handed over."""
    import gc
    import shutil

    import _anchors

    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp, "model")
        shutil.copytree(path, folder)
        config_path = folder / "genai_config.json"
        config = json.loads(config_path.read_text())
        options = config["model"]["decoder"].setdefault("session_options", {})
        options.update({"intra_op_num_threads": threads, "inter_op_num_threads": 1, "log_severity_level": 3,
                        "enable_profiling": os.path.join(tmp, "genai")})
        config_path.write_text(json.dumps(config, indent=4))
        loaded = _anchors.Loaded("ort-genai", str(folder), __import__("onnxruntime_genai").Model(
            __import__("onnxruntime_genai").Config(str(folder))))
        calls, walls = [], []
        for prompt, new in plan:
            ids = [(i % (vocab - 3)) + 3 for i in range(prompt)]
            timing = _anchors.decode_timings(loaded, ids, new)
            calls.append((1, new - 1))
            walls.append(timing["step_s"])
        del loaded
        gc.collect()  # the session writes its profile when it closes
        files = sorted(Path(tmp).glob("genai*.json"))
        if not files:
            raise RuntimeError("ONNX Runtime GenAI wrote no profile (session_options.enable_profiling)")
        events = json.loads(files[-1].read_text())
    per_run = ort_profile_runs(events)
    add_walls(per_run, calls, walls)
    return per_run, calls


def ort_profile_runs(events: list[dict]) -> list[dict[str, float]]:
    """Per session run of an ONNX Runtime profile (in order): op type -> ms, ``total`` (the run) and what the
    session spent outside the kernels."""
    runs = sorted((e for e in events if e.get("cat") == "Session" and e.get("name") == "model_run"),
                  key=lambda e: e["ts"])
    per_run: list[collections.Counter] = [collections.Counter() for _ in runs]
    starts = [r["ts"] for r in runs]
    for run, counter in zip(runs, per_run, strict=True):
        counter["total"] = run["dur"] / 1e3
    for event in events:
        if event.get("cat") != "Node" or not event.get("name", "").endswith("_kernel_time"):
            continue
        k = max(0, bisect.bisect_right(starts, event["ts"]) - 1)  # the last run that started before the node
        per_run[k][event["args"].get("op_name", "?")] += event["dur"] / 1e3
    for counter in per_run:  # what the session spent outside the kernels
        counter["overhead: session run"] = max(0.0, counter["total"] - sum(v for op, v in counter.items()
                                                                             if op != "total"))
    return [dict(c) for c in per_run]


# ── the table ───────────────────────────────────────────────────────────────────────────────────────────────
def decode_runs(per_run: list[dict[str, float]], calls: list[tuple[int, int]]) -> list[list[dict[str, float]]]:
    """The decode runs of each ``generate`` call, from its (prefill runs, decode runs)."""
    out, index = [], 0
    for prefill, decode in calls:
        index += prefill
        out.append(per_run[index:index + decode])
        index += decode
    if index != len(per_run):
        raise RuntimeError(f"expected {index} program runs from the plan, the profile has {len(per_run)}")
    return out


def medians(runs: list[dict[str, float]]) -> dict[str, float]:
    ops = {op for run in runs for op in run}
    return {op: statistics.median(run.get(op, 0.0) for run in runs) for op in ops}


def print_table(results: dict[str, list[dict[str, float]]], positions: list[int]) -> None:
    backends = list(results)
    for i, position in enumerate(positions):
        print(f"\n## decode step near {position} cached positions: ms per step (median)")
        grouped: dict[str, dict[str, float]] = {b: collections.Counter() for b in backends}
        detail: dict[str, dict[str, collections.Counter]] = {b: collections.defaultdict(collections.Counter)
                                                               for b in backends}
        totals, walls = {}, {}
        for backend in backends:
            step = results[backend][i]
            totals[backend], walls[backend] = step.get("total", 0.0), step.get("wall")
            for op, ms in step.items():
                if op in ("total", "wall"):
                    continue
                grouped[backend][group_of(op)] += ms
                detail[backend][group_of(op)][op] += ms
        groups = sorted({g for b in backends for g in grouped[b]},
                        key=lambda g: -max(grouped[b].get(g, 0.0) for b in backends))
        header = f"{'group':<20}" + "".join(f" | {b:>20}" for b in backends)
        if len(backends) == 2:
            header += f" | {backends[0] + ' - ' + backends[1]:>30}"
        print(header)
        print("-" * len(header))
        for g in groups:
            row = f"{g:<20}" + "".join(f" | {grouped[b].get(g, 0.0):>20.3f}" for b in backends)
            if len(backends) == 2:
                row += f" | {grouped[backends[0]].get(g, 0.0) - grouped[backends[1]].get(g, 0.0):>+30.3f}"
            print(row)
        row = f"{'step (measured)':<20}" + "".join(f" | {totals[b]:>20.3f}" for b in backends)
        if len(backends) == 2:
            row += f" | {totals[backends[0]] - totals[backends[1]]:>+30.3f}"
        print(row)
        if all(walls[b] is not None for b in backends):
            row = f"{'step (wall)':<20}" + "".join(f" | {walls[b]:>20.3f}" for b in backends)
            if len(backends) == 2:
                row += f" | {walls[backends[0]] - walls[backends[1]]:>+30.3f}"
            print(row)
        for backend in backends:
            print(f"\n{backend}, the ops of each group (ms per step):")
            for g in groups:
                ops = detail[backend].get(g)
                if ops:
                    listed = ", ".join(f"{op} {ms:.3f}" for op, ms in ops.most_common(6))
                    print(f"  {g}: {listed}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", choices=list(bench.SIZES), default="toy")
    parser.add_argument("--backends", nargs="*", default=["executorch-xnnpack", "onnx"])
    parser.add_argument("--positions", nargs="*", type=int, default=[64, 1000])
    parser.add_argument("--steps", type=int, default=8, help="decode steps profiled near each position")
    parser.add_argument("--exports", default=None, help="where the exports are kept (reused when present)")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()

    import torch

    torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore")
    if any(b.startswith("executorch") for b in args.backends):
        from executorch.extension.pybindings import portable_lib

        portable_lib._unsafe_reset_threadpool(args.threads)  # before any program loads: resetting later crashes
    model = bench.seeded_llama(bench.SIZES[args.size])
    vocab = model.config.vocab_size
    max_cache_len = max(args.positions) + args.steps + 8
    root = Path(args.exports or os.path.join(tempfile.gettempdir(), f"hfexport-decode-ops-{args.size}"))
    plan = decode_plan(args.positions, args.steps)
    print(f"# profile_decode_ops: seeded {type(model).__name__} ({args.size}), {args.threads} thread(s), "
          f"{args.steps} decode steps near each of {args.positions} cached positions, load average "
          f"{os.getloadavg()[0]:.2f}")
    results = {}
    for backend in args.backends:
        if backend == "ort-genai":
            per_run, calls = profile_ort_genai(convert_if_missing(model, root), plan, vocab, args.threads)
            results[backend] = [medians(runs) for runs in decode_runs(per_run, calls)]
            continue
        path = export_if_missing(backend, model, root / backend, max_cache_len)
        if backend.startswith("executorch"):
            per_run, calls = profile_executorch(path, plan, vocab)
        elif backend == "onnx":
            per_run, calls = profile_onnx(path, plan, vocab, args.threads)
        else:
            raise SystemExit(f"profile_decode_ops: no op profiler for {backend!r} (executorch-xnnpack, onnx, "
                             "ort-genai)")
        results[backend] = [medians(runs) for runs in decode_runs(per_run, calls)]
    print_table(results, args.positions)


if __name__ == "__main__":
    main()
