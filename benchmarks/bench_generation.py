"""Generation benchmark: greedy decoding of a seeded Llama-family model with hfexport's exported ``decoder`` program
(``hfexport.export(..., task="text-generation")``) on each backend's runtime, against eager PyTorch ``generate`` and
the engines users would pick instead, measured in the same run: ONNX Runtime GenAI (its model builder; fp32, int4),
CTranslate2 (fp32, int8), openvino-genai and optimum-executorch (fp32) from ``benchmarks/_anchors.py``.

Every engine gets the same model directory (``save_pretrained``) and the same token ids; batch 1, one thread
(``--threads``), ``eos_token_id=None`` so that every run generates all its tokens. Prints, per engine:
  * export: wall time and peak resident memory of the export, each in its own process (model loading, tracing,
    lowering, the verification run and saving for hfexport; the converter's command for the anchors), and the
    artifact's bytes on disk with their ratio to the model's weight bytes (goal: <= 1.15x);
  * loaded: the resident memory a loaded hfexport artifact adds (a fresh process, after importing the toolchain:
    the growth of its anonymous memory through loading and a short generate, plus the resident pages of the
    artifact's own files that the runtime maps; code pages of libraries that the first generate touches are not the
    artifact's), with its ratio to weights + the planned cache (goal: <= 1.3x), and the process's peak RSS growth
    beside it;
  * decode tok/s at each working point (``--points``, default prompt 32 + 64 new and 512 + 512): decode steps / the
    time from the first new token to the last;
  * ms per token near 64 and near 1,000 cached positions (median of the steps within 16 positions), and their ratio
    (goal: <= 1.25x: a token's cost does not grow with the context beyond attention's reads);
  * whether the token ids equal eager's exactly (float engines must; quantized ones report top-1 agreement).

Rounds are interleaved: each round runs every engine once per working point; medians over ``--repeats`` rounds.
Sizes: ``--size toy`` (hidden 512, 8 layers, vocab 32k, 58 M parameters), ``small`` (a quick check) and ``0.5b``
(Qwen2-0.5B-shaped: hidden 896, 24 layers, 14 heads, 2 KV heads, vocab 151,936, 494 M parameters; one round is
enough there).

Run: HF_HUB_OFFLINE=1 uv run --group bench python benchmarks/bench_generation.py [--size toy|small|0.5b]
     [--backends onnx executorch-xnnpack dynamo openvino onnx-small-pages] [--quantized onnx:int4 onnx:int8-dynamic]
     [--anchors ort-genai:fp32 ort-genai:int4 ctranslate2:float32 ctranslate2:int8 openvino-genai:hfexport
      openvino-genai:optimum-fp32 openvino-genai:optimum-int4 optimum-executorch:fp32] [--points 32+64 512+512]
     [--repeats 3] [--threads 1] [--max-cache-len N] [--min-cosine X] [--json out.json]
     HF_HUB_OFFLINE=1 uv run python benchmarks/bench_generation.py --vlm [--backends onnx executorch-xnnpack]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

BACKENDS = ("onnx", "executorch-xnnpack", "dynamo", "openvino", "openvino-fixed", "onnx-small-pages")
# a benchmark name -> (hfexport backend, its options): openvino-fixed is openvino's kv_cache="fixed" (the layout
# before the growing cache: max_cache_len positions, attention over all of them)
BACKEND_OPTIONS = {"openvino-fixed": ("openvino", {"kv_cache": "fixed"}), "onnx-small-pages": ("onnx", {})}
# a benchmark name -> attributes set on each loaded runner before its session reopens: onnx-small-pages is onnx with
# the session's weights left in 4 KiB pages (OnnxRunner.huge_pages=False), the layout before the huge pages
RUNNER_ATTRIBUTES = {"onnx-small-pages": {"huge_pages": False}}
FULL = {"hidden_size": 512, "num_hidden_layers": 8, "num_attention_heads": 8, "num_key_value_heads": 8,
        "intermediate_size": 1376, "vocab_size": 32000}
SMALL = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 4,
         "intermediate_size": 172, "vocab_size": 1000}
QWEN2_05B = {"hidden_size": 896, "num_hidden_layers": 24, "num_attention_heads": 14, "num_key_value_heads": 2,
             "intermediate_size": 4864, "vocab_size": 151936}
SIZES = {"toy": FULL, "small": SMALL, "0.5b": QWEN2_05B}
ANCHORS = ("ort-genai:fp32", "ort-genai:int4", "ctranslate2:float32", "ctranslate2:int8")
PROBES = (64, 1000)
PROBE_WINDOW = 16


def seeded_llama(sizes: dict, seed: int = 0):
    """A seeded ``LlamaForCausalLM`` (``Qwen2ForCausalLM`` for the 0.5B shape, with tied embeddings as Qwen2-0.5B)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    if sizes is QWEN2_05B:
        config = Qwen2Config(**sizes, max_position_embeddings=32768, tie_word_embeddings=True, bos_token_id=1,
                             eos_token_id=2, pad_token_id=0, rope_theta=1e6)
        return Qwen2ForCausalLM(config).eval()
    config = LlamaConfig(**sizes, max_position_embeddings=2048, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    return LlamaForCausalLM(config).eval()


def weight_bytes(model) -> int:
    """Bytes of the model's parameters, each storage counted once (tied embeddings once)."""
    seen, total = set(), 0
    for p in model.parameters():
        if p.data_ptr() not in seen:
            seen.add(p.data_ptr())
            total += p.numel() * p.element_size()
    return total


def dir_bytes(path: str | Path) -> int:
    return sum(p.stat().st_size for p in Path(path).rglob("*") if p.is_file())


def own_peak_rss() -> int:
    """This process's peak resident bytes: ``VmHWM`` (its own memory since its ``exec``), and its children's.

    Not ``ru_maxrss``: Linux folds the RSS a process had before ``exec`` into it, so a child of a parent holding
    2 GB reports at least 2 GB (measured: a child of an 800 MiB parent reports 813 MiB, VmHWM 13 MiB)."""
    import resource

    with open("/proc/self/status") as status:
        hwm = next((int(line.split()[1]) * 1024 for line in status if line.startswith("VmHWM:")), 0)
    return max(hwm, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024)


def run_child(args: list[str]) -> tuple[float, int, str]:
    """Run this script with ``args`` in a fresh process; (wall s, that process's peak RSS bytes, output tail). The
    child prints its own peak (``PEAK <bytes>``, :func:`own_peak_rss`); ``wait4``'s figure is the fallback."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    log = tempfile.TemporaryFile()
    start = time.perf_counter()
    process = subprocess.Popen([sys.executable, os.path.abspath(__file__), *args], stdout=log,
                               stderr=subprocess.STDOUT, env=env)
    _, status, usage = os.wait4(process.pid, 0)
    wall = time.perf_counter() - start
    log.seek(0)
    tail = log.read().decode(errors="replace")[-4000:]
    if os.waitstatus_to_exitcode(status) != 0:
        raise RuntimeError(f"{' '.join(args[:3])} failed:\n{tail}")
    peak = usage.ru_maxrss * 1024
    if "PEAK " in tail:
        peak = int(tail[tail.rindex("PEAK ") + 5:].split()[0])
    return wall, peak, tail


# ── children: one export, one load ──────────────────────────────────────────────────────────────────────────
def export_child(backend: str, quantize: str, hf_dir: str, out_dir: str, max_cache_len: int, threads: int,
                 min_cosine: float | None = None) -> None:
    """What a user runs: load the saved model, export it for generation (verified), save the artifact."""
    import torch
    from transformers import AutoModelForCausalLM

    import hfexport

    torch.set_num_threads(threads)
    warnings.filterwarnings("ignore")
    model = AutoModelForCausalLM.from_pretrained(hf_dir).eval()
    options = {"task": "text-generation", "max_cache_len": max_cache_len or None}
    backend, more = BACKEND_OPTIONS.get(backend, (backend, {}))
    options.update(more)
    if quantize != "none":  # a random-weight model's logits can sit below a recipe's default threshold
        options["quantize"] = quantize if min_cosine is None else hfexport.Quantization(quantize, min_cosine=min_cosine)
    exported = hfexport.export(model, backend=backend, **options)
    exported.save_pretrained(out_dir)
    print(f"PEAK {own_peak_rss()}", flush=True)


def rss_bytes(field: str = "VmRSS:") -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field):
                return int(line.split()[1]) * 1024
    return 0


def load_child(out_dir: str, backend: str) -> None:
    """RSS after importing the toolchain, then the peak after loading the artifact and a short generate (JSON)."""
    import torch

    import hfexport

    torch.set_num_threads(1)
    warnings.filterwarnings("ignore")
    if backend.startswith("onnx"):
        import onnxruntime  # noqa: F401
    elif backend.startswith("openvino"):
        import openvino  # noqa: F401
    elif backend.startswith("executorch"):
        from executorch.runtime import Runtime

        Runtime.get()
    before, anon_before = rss_bytes(), rss_bytes("RssAnon:")
    exported = hfexport.load(out_dir)
    exported.generate(torch.tensor([[5, 6, 7, 8]]), max_new_tokens=4, eos_token_id=None)
    peak = own_peak_rss()
    print("LOAD " + json.dumps({"before": before, "peak": peak, "anon": rss_bytes("RssAnon:") - anon_before,
                                "mapped": mapped_rss_bytes(out_dir)}))


def mapped_rss_bytes(directory: str) -> int:
    """Resident bytes of this process's mappings of files under ``directory`` (/proc/self/smaps)."""
    root, total, inside = os.path.realpath(directory) + os.sep, 0, False
    with open("/proc/self/smaps") as smaps:
        for line in smaps:
            fields = line.split()
            if fields and "-" in fields[0] and not fields[0].endswith(":"):  # a mapping's header line
                inside = len(fields) >= 6 and os.path.realpath(fields[5]).startswith(root)
            elif inside and fields[0] == "Rss:":
                total += int(fields[1]) * 1024
    return total


# ── timing ──────────────────────────────────────────────────────────────────────────────────────────────────
def probe_ms(step_s: list[float], prompt: int) -> dict[int, float]:
    """Median ms of the decode steps within ``PROBE_WINDOW`` of each probe position (step k writes position
    prompt + k), for the probes a run covers (at least half its window)."""
    at = {}
    for position in PROBES:
        window = [s * 1e3 for k, s in enumerate(step_s) if abs(prompt + k - position) <= PROBE_WINDOW]
        if len(window) >= PROBE_WINDOW:
            at[position] = statistics.median(window)
    return at


class StepClock:
    """A logits processor that changes nothing and stamps each step of eager ``generate``."""

    def __init__(self):
        self.stamps: list[float] = []

    def __call__(self, input_ids, scores):
        self.stamps.append(time.perf_counter())
        return scores


def eager_run(model, prompt_ids: list[int], new_tokens: int) -> dict:
    import torch
    from transformers import LogitsProcessorList

    clock, ids = StepClock(), torch.tensor([prompt_ids])
    with torch.no_grad():
        out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=False,
                             max_new_tokens=new_tokens, eos_token_id=None, logits_processor=LogitsProcessorList([clock]))
    steps = [b - a for a, b in zip(clock.stamps, clock.stamps[1:], strict=False)]
    return {"ids": out[0, len(prompt_ids):].tolist(), "step_s": steps}


def hfexport_run(exported, prompt_ids: list[int], new_tokens: int) -> dict:
    import torch

    out = exported.generate(torch.tensor([prompt_ids]), max_new_tokens=new_tokens, eos_token_id=None)
    return {"ids": out[0, len(prompt_ids):].tolist(), "step_s": list(exported.generation_stats["decode_step_s"])}


def anchor_run(anchors, loaded, prompt_ids: list[int], new_tokens: int) -> dict:
    timing = anchors.decode_timings(loaded, prompt_ids, new_tokens)
    return {"ids": timing["ids"], "step_s": timing["step_s"]}


def set_openvino_threads(exported, threads: int) -> None:
    """Recompile each OpenVINO runner with ``INFERENCE_NUM_THREADS=threads``."""
    for component in exported.components.values():
        component.runner.num_threads = threads
        component.runner.open()


def set_ort_threads(exported, threads: int) -> None:
    """Reopen each ONNX Runtime session with ``threads`` intra-op threads and one inter-op thread."""
    import onnxruntime

    for component in exported.components.values():
        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
        options.log_severity_level = 3
        component.runner.session_options = options
        component.runner.open()


# ── main ────────────────────────────────────────────────────────────────────────────────────────────────────
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", choices=list(SIZES), default="toy", help="the seeded model (default toy)")
    parser.add_argument("--backends", nargs="*", default=["onnx", "executorch-xnnpack"],
                        help=f"hfexport backends, float ({', '.join(BACKENDS)})")
    parser.add_argument("--quantized", nargs="*", default=[], metavar="BACKEND:RECIPE",
                        help="hfexport quantized exports, e.g. onnx:int4 onnx:int8-dynamic executorch-xnnpack:8da4w")
    parser.add_argument("--anchors", nargs="*", default=list(ANCHORS), metavar="ENGINE:VARIANT",
                        help=f"engines users would pick instead (needs `--group bench`): {', '.join(ANCHORS)}")
    parser.add_argument("--points", nargs="+", default=["32+64", "512+512"], metavar="PROMPT+NEW",
                        help="working points: prompt tokens + new tokens")
    parser.add_argument("--repeats", type=int, default=3, help="timed rounds after one warm-up round (median)")
    parser.add_argument("--threads", type=int, default=1, help="threads of every engine")
    parser.add_argument("--max-cache-len", type=int, default=0,
                        help="hfexport's max_cache_len (default: hfexport's own, the model's positions capped at 4096)")
    parser.add_argument("--no-eager", action="store_true", help="skip eager timing (its ids are still the reference)")
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    parser.add_argument("--min-cosine", type=float, default=None,
                        help="the quantized exports' verification threshold (logits cosine against float eager; "
                             "default: the recipe's). The seeded random-weight 0.5b model's int4 logits reach 0.88, "
                             "below int4's 0.9: --min-cosine 0.85 keeps it and reports its top-1 agreement")
    parser.add_argument("--vlm", action="store_true",
                        help="a SmolVLM-shaped seeded vision-language model (task image-text-to-text) instead: "
                             "vision ms per image, the prompt's image encoding ms and decode tok/s at 32 + 64 against "
                             "eager (benchmarks/_vlm_bench.py; --backends, --repeats, --threads, --json apply)")
    parser.add_argument("--export-child", nargs=7, help=argparse.SUPPRESS)
    parser.add_argument("--load-child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.export_child:
        backend, quantize, hf_dir, out_dir, max_cache_len, threads, min_cosine = args.export_child
        return export_child(backend, quantize, hf_dir, out_dir, int(max_cache_len), int(threads),
                            None if min_cosine == "none" else float(min_cosine))
    if args.load_child:
        return load_child(*args.load_child)

    import torch

    import hfexport

    warnings.filterwarnings("ignore")
    torch.set_num_threads(args.threads)
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    if any(b.startswith("executorch") for b in args.backends + args.quantized) or any(
            a.startswith("optimum-executorch") for a in args.anchors):
        from executorch.extension.pybindings import portable_lib

        portable_lib._unsafe_reset_threadpool(args.threads)  # before any program loads: resetting later crashes
    if args.vlm:
        import _vlm_bench

        print(f"# bench_generation --vlm: torch {torch.__version__}; {os.cpu_count()} CPUs, {args.threads} thread(s), "
              f"load average {os.getloadavg()[0]:.2f}")
        result = _vlm_bench.main(args.backends, args.repeats, args.threads, args.max_cache_len or 256,
                                 set_ort_threads)
        if args.json:
            Path(args.json).write_text(json.dumps(result, indent=2))
        return None
    sizes = SIZES[args.size]
    points = [tuple(int(x) for x in p.split("+")) for p in args.points]
    versions = hfexport._artifact.versions_of(("torch", "transformers", "onnxruntime", "executorch", "openvino",
                                               "openvino-genai",
                                               "onnxruntime-genai", "ctranslate2"))
    print(f"# bench_generation: {', '.join(f'{k} {v}' for k, v in versions.items())}; {os.cpu_count()} CPUs, "
          f"{args.threads} thread(s), load average {os.getloadavg()[0]:.2f}")
    model = seeded_llama(sizes)
    weights = weight_bytes(model)
    print(f"seeded {type(model).__name__} ({', '.join(f'{k} {v}' for k, v in sizes.items())}): "
          f"{sum(p.numel() for p in model.parameters()) / 1e6:.0f} M parameters, {weights / 1e6:.0f} MB of weights; "
          f"batch 1, working points {', '.join(args.points)}; median of {args.repeats} rounds after 1 warm-up")
    generator = torch.Generator().manual_seed(1)
    longest = max(p for p, _ in points)
    prompt_all = torch.randint(3, sizes["vocab_size"], (longest,), generator=generator).tolist()
    prompts = {p: prompt_all[:p] for p, _ in points}

    engines: dict[str, dict] = {}  # name -> {"kind", "run", exports figures...}
    results: dict[str, dict] = {}
    work = tempfile.mkdtemp(prefix="bench-generation-")
    hf_dir = os.path.join(work, "hf")
    model.save_pretrained(hf_dir)
    max_cache_len = args.max_cache_len or 0

    hfexport_jobs = [(b, "none") for b in args.backends] + [tuple(q.split(":", 1)) for q in args.quantized]
    for backend, quantize in hfexport_jobs:
        name = f"hfexport {backend}" + ("" if quantize == "none" else f" {quantize}")
        out_dir = os.path.join(work, name.replace(" ", "_"))
        row = results[name] = {"kind": "hfexport", "backend": backend, "quantize": quantize}
        try:
            wall, peak, _ = run_child(["--export-child", backend, quantize, hf_dir, out_dir, str(max_cache_len),
                                       str(args.threads), "none" if args.min_cosine is None else str(args.min_cosine)])
            _, _, tail = run_child(["--load-child", out_dir, backend])
        except RuntimeError as error:
            row["error"] = str(error)[-2000:]
            print(f"{name}: FAILED\n{row['error']}")
            continue
        loaded = json.loads(tail[tail.rindex("LOAD ") + 5:].splitlines()[0])
        exported = hfexport.load(out_dir)
        for component in exported.components.values():
            for attribute, value in RUNNER_ATTRIBUTES.get(backend, {}).items():
                setattr(component.runner, attribute, value)
        if BACKEND_OPTIONS.get(backend, (backend,))[0] == "onnx":
            set_ort_threads(exported, args.threads)
        elif backend.startswith("openvino"):
            set_openvino_threads(exported, args.threads)
        section = exported.manifest["generation"]
        cache_bytes = sum(section["max_batch"] * section["max_cache_len"] * (k[0] * k[2] + v[0] * v[2]) * 4
                          for k, v in section["cache"]["row_shapes"])
        row.update(export_s=wall, export_peak_rss=peak, disk_bytes=dir_bytes(out_dir),
                   loaded_rss=loaded["anon"] + loaded["mapped"], loaded_peak_rss=loaded["peak"] - loaded["before"],
                   cache_bytes=cache_bytes,
                   max_cache_len=section["max_cache_len"])
        engines[name] = {"run": lambda p, n, e=exported: hfexport_run(e, p, n)}
        print(f"{name}: exported in {wall:.1f} s, peak RSS {peak / 2**20:.0f} MiB, {row['disk_bytes'] / 1e6:.0f} MB "
              f"on disk ({row['disk_bytes'] / weights:.2f}x weights), loaded +{row['loaded_rss'] / 2**20:.0f} MiB "
              f"(max_cache_len {section['max_cache_len']}, cache {cache_bytes / 2**20:.0f} MiB)", flush=True)

    if args.anchors:
        import _anchors

        for spec in args.anchors:
            engine, variant = spec.split(":", 1)
            name = f"{engine} {variant}"
            out_dir = os.path.join(work, name.replace(" ", "_"))
            row = results[name] = {"kind": "anchor"}
            try:
                converted = _anchors.convert(engine, hf_dir, out_dir, variant)
            except Exception as error:
                row["error"] = str(error)[-2000:]
                print(f"{name}: FAILED\n{row['error']}")
                continue
            row.update(export_s=converted["wall_s"], export_peak_rss=converted["peak_rss_bytes"],
                       disk_bytes=converted["disk_bytes"])
            loaded = _anchors.load(engine, out_dir, args.threads)
            engines[name] = {"run": lambda p, n, a=loaded: anchor_run(_anchors, a, p, n)}
            print(f"{name}: converted in {converted['wall_s']:.1f} s, peak RSS "
                  f"{converted['peak_rss_bytes'] / 2**20:.0f} MiB, {converted['disk_bytes'] / 1e6:.0f} MB on disk",
                  flush=True)

    reference = {}
    eager_runs: dict = {}
    for prompt, new in points:
        start = time.perf_counter()
        run = eager_run(model, prompts[prompt], new)
        reference[(prompt, new)] = run["ids"]
        eager_runs[(prompt, new)] = [run]
        print(f"eager generate {prompt}+{new}: {time.perf_counter() - start:.1f} s", flush=True)
    if not args.no_eager:
        engines = {"eager generate": {"run": lambda p, n: eager_run(model, p, n)}, **engines}
        results["eager generate"] = {"kind": "eager"}

    samples: dict = {name: {point: [] for point in points} for name in engines}
    for round_index in range(args.repeats + 1):  # round 0 warms up and checks ids
        for point in points:
            prompt, new = point
            for name, engine in engines.items():
                if round_index == 0 and name == "eager generate":
                    run = eager_runs[point][0]
                else:
                    run = engine["run"](prompts[prompt], new)
                if round_index == 0:
                    expected = reference[point]
                    agree = sum(a == b for a, b in zip(run["ids"], expected, strict=False)) / len(expected)
                    results[name].setdefault("ids", {})[f"{prompt}+{new}"] = {
                        "equal": run["ids"] == expected, "agreement": agree}
                else:
                    samples[name][point].append(run["step_s"])
        print(f"round {round_index} done (load average {os.getloadavg()[0]:.2f})", flush=True)

    for name in engines:
        row = results[name]
        for (prompt, new), runs in samples[name].items():
            key = f"{prompt}+{new}"
            tok_s = statistics.median(len(s) / sum(s) for s in runs if s)
            row.setdefault("tok_s", {})[key] = tok_s
            for position, ms in probe_ms([statistics.median(col) for col in zip(*runs, strict=False)], prompt).items():
                row.setdefault("ms_at", {})[position] = ms

    def cell(value, spec, scale=1.0):
        return "-" if value is None else format(value / scale, spec)

    keys = [f"{p}+{n}" for p, n in points]
    header = (f"{'engine':<34} | {'export s':>8} | {'peak MiB':>8} | {'disk MB':>7} | {'x wts':>5} | {'load MiB':>8} | "
              + " | ".join(f"{k + ' tok/s':>13}" for k in keys)
              + f" | {'ms@64':>6} | {'ms@1000':>7} | {'1000/64':>7} | ids equal eager (top-1 agreement)")
    print("\n" + header + "\n" + "-" * len(header))
    for name, row in results.items():
        if "error" in row:
            print(f"{name:<34} | FAILED: {row['error'].strip().splitlines()[-1][:150]}")
            continue
        ms = row.get("ms_at", {})
        ratio = ms[1000] / ms[64] if 64 in ms and 1000 in ms else None
        ids = ", ".join(f"{'yes' if v['equal'] else 'no'} ({v['agreement']:.2f})" for v in row.get("ids", {}).values())
        print(f"{name:<34} | {cell(row.get('export_s'), '8.1f')} | {cell(row.get('export_peak_rss'), '8.0f', 2**20)} | "
              f"{cell(row.get('disk_bytes'), '7.0f', 1e6)} | {cell(row.get('disk_bytes'), '5.2f', weights)} | "
              f"{cell(row.get('loaded_rss'), '8.0f', 2**20)} | "
              + " | ".join(f"{cell(row.get('tok_s', {}).get(k), '13.1f')}" for k in keys)
              + f" | {cell(ms.get(64), '6.2f')} | {cell(ms.get(1000), '7.2f')} | {cell(ratio, '7.2f')} | {ids}")
    print(f"\nweights {weights / 1e6:.0f} MB; 'x wts': bytes on disk / weight bytes (goal <= 1.15); 'load MiB': "
          "memory a loaded artifact adds after a 4-token generate, anonymous + its files' mapped pages (goal <= 1.3x "
          "weights + planned cache); ms@N: median decode step near N cached positions; '1000/64' goal <= 1.25")
    for name, row in results.items():
        if row.get("kind") == "hfexport" and "loaded_rss" in row:
            print(f"{name}: loaded / (weights + cache {row['cache_bytes'] / 2**20:.0f} MiB) = "
                  f"{row['loaded_rss'] / (weights + row['cache_bytes']):.2f} (the process's peak RSS grew "
                  f"{row['loaded_peak_rss'] / 2**20:.0f} MiB, library code pages included)")
    if args.json:
        with open(args.json, "w") as file:
            json.dump({"size": args.size, "model": sizes, "weights_bytes": weights, "points": keys,
                       "threads": args.threads, "repeats": args.repeats, "versions": versions,
                       "results": {k: {kk: vv for kk, vv in v.items()} for k, v in results.items()}},
                      file, indent=2, default=str)
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
