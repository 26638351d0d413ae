"""Generation benchmark: greedy decoding of a seeded Llama over the exported prefill and decode programs
(``hfexport.export(..., task="text-generation")``) on each backend's runtime, against eager PyTorch ``generate``.

Prints, measured in this run (batch 1, a prompt of 32 seeded tokens, 64 new tokens, ``eos_token_id=None`` so that
every run generates all of them):
  * export wall time per backend (both components; toolchains imported and, by default, one tiny export per
    backend done first, so that first-import and first-trace costs go to no timed export);
  * prefill latency: the exported prefill program (``generation_stats["prefill_s"]``, input checks included)
    against one eager forward of the prompt (``use_cache=True, logits_to_keep=1``, as ``generate`` calls it);
  * decode tokens/s: 63 decode steps (the first new token comes from the prefill) over the time from the
    first to the last token (``generation_stats``; for eager, a logits processor stamps each step of
    ``model.generate(do_sample=False, max_new_tokens=64, eos_token_id=None)``), and the ratio to eager
    (goal: >= 1.5x on ONNX Runtime and ExecuTorch);
  * whether each backend's token ids equal eager's exactly (they must);
  * ExecuTorch's planned memory (prefill + decode programs, for the bounds ``max_batch`` x ``max_cache_len``);
  * a breakdown of one decode call on each runtime (input checks, flattening and copies, the runtime itself).

Medians of ``--repeats`` interleaved rounds (one call of each runtime per round) after a warm-up round. torch,
ONNX Runtime (intra-op) and ExecuTorch (XNNPACK threadpool) run on ``--threads`` threads, printed.

Run: HF_HUB_OFFLINE=1 uv run python benchmarks/bench_generation.py [--small] [--repeats 3] [--threads 1]
     [--backends dynamo onnx executorch-xnnpack] [--max-cache-len 128] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
import warnings

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

BACKENDS = ("dynamo", "onnx", "executorch-xnnpack")
FULL = {"hidden_size": 512, "num_hidden_layers": 8, "num_attention_heads": 8, "num_key_value_heads": 8,
        "intermediate_size": 1376, "vocab_size": 32000}
SMALL = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 4,
         "intermediate_size": 172, "vocab_size": 1000}


def seeded_llama(sizes: dict, seed: int = 0):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(**sizes, max_position_embeddings=2048, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    return LlamaForCausalLM(config).eval()


def timed(fn):
    start = time.perf_counter()
    result = fn()
    return result, time.perf_counter() - start


def warm_toolchains(backends) -> float:
    """Import every toolchain before any timed export (the first ExecuTorch import costs tens of seconds)."""
    start = time.perf_counter()
    import hfexport_dynamo.exporter_dynamo  # noqa: F401

    if "onnx" in backends:
        import onnxruntime  # noqa: F401

        import hfexport_onnx.exporter_onnx  # noqa: F401
    if any(b.startswith("executorch") for b in backends):
        import executorch.exir  # noqa: F401
        from executorch.runtime import Runtime

        import hfexport_executorch.exporter_executorch  # noqa: F401

        Runtime.get()
    return time.perf_counter() - start


def set_ort_threads(exported, threads: int) -> list[tuple[int, int]]:
    """Reopen each component's ONNX Runtime session with ``threads`` intra-op threads (the runner takes an
    ``onnxruntime.SessionOptions``; an export's runner is made with the default options, which use every
    physical core). Returns the (intra, inter) settings the sessions report."""
    import onnxruntime

    settings = []
    for component in exported.components.values():
        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = threads
        options.log_severity_level = 3
        component.runner.session_options = options
        component.runner.open()
        reported = component.runner.session.get_session_options()
        settings.append((reported.intra_op_num_threads, reported.inter_op_num_threads))
    return settings


def planned_memory(exported) -> dict[str, int] | None:
    """ExecuTorch's planned (non-constant) bytes per component, as the exporter records them."""
    sections = exported.manifest.get("components", {})
    planned = {name: section.get("executorch", {}).get("planned_memory_bytes") for name, section in sections.items()}
    return planned if planned and all(isinstance(v, int) for v in planned.values()) else None


class StepClock:
    """A logits processor that changes nothing and stamps the time of each step of eager ``generate``: the first
    call comes right after the prefill forward, each later one after a decode forward."""

    def __init__(self):
        self.stamps: list[float] = []

    def __call__(self, input_ids, scores):
        self.stamps.append(time.perf_counter())
        return scores


def eager_generate(model, ids, mask, new_tokens: int):
    import torch
    from transformers import LogitsProcessorList

    clock = StepClock()
    with torch.no_grad():
        start = time.perf_counter()
        out = model.generate(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=new_tokens,
                             eos_token_id=None, logits_processor=LogitsProcessorList([clock]))
        total = time.perf_counter() - start
    steps = len(clock.stamps) - 1
    return out, {"generate_s": total, "decode_s": clock.stamps[-1] - clock.stamps[0], "decode_steps": steps}


def eager_prefill(model, ids, mask) -> float:
    import torch

    with torch.no_grad():
        _, seconds = timed(lambda: model(input_ids=ids, attention_mask=mask, use_cache=True, logits_to_keep=1))
    return seconds


def decode_breakdown(backend: str, exported, ids, mask, past_tokens: int, repeats: int) -> dict[str, float]:
    """Median microseconds of one decode call at ``past_tokens`` cached positions, split into what
    ``ExportedModel.run`` does: the manifest input checks, the runner (pytree flattening, contiguous CPU copies,
    the runtime call, output conversion or copies) and the bare runtime call on prepared inputs."""
    import torch
    import torch.utils._pytree as pytree

    from hfexport._input_check import check_call_inputs
    from hfexport_dynamo.generation import positions_from_mask

    exported.generate(ids, mask, max_new_tokens=past_tokens - ids.shape[1], eos_token_id=None)  # a realistic past
    positions = positions_from_mask(mask)
    out = exported.run("prefill", input_ids=ids, attention_mask=mask, position_ids=positions)
    cache = out["cache"]
    token = out["logits"].argmax(-1)[:, None]
    step_mask, step_pos = mask, positions[:, -1:]
    for _ in range(past_tokens - ids.shape[1]):  # grow the cache to past_tokens positions
        step_mask = torch.cat([step_mask, step_mask.new_ones((step_mask.shape[0], 1))], -1)
        step_pos = step_pos + 1
        out = exported.run("decode", input_ids=token, attention_mask=step_mask, position_ids=step_pos, cache=cache)
        cache, token = out["cache"], out["logits"].argmax(-1)[:, None]
    step_mask = torch.cat([step_mask, step_mask.new_ones((step_mask.shape[0], 1))], -1)
    feed = {"input_ids": token, "attention_mask": step_mask, "position_ids": step_pos + 1, "cache": cache}
    part = exported.components["decode"]
    section = exported.manifest["components"]["decode"]
    names = [i["name"] for i in section["inputs"]]
    args = tuple(feed[n] for n in names)
    runner = part.runner
    if hasattr(runner, "flat_inputs"):  # file-backed runtimes: leaves detached, on the CPU, contiguous, cast
        def flatten():
            return runner.flat_inputs(args, getattr(runner, "input_dtypes", ()))
    else:  # the .pt2 program's module flattens its own inputs
        def flatten():
            return pytree.tree_leaves(args)
    flat = flatten()
    calls = {
        "ExportedModel.run": lambda: exported.run("decode", **feed),
        "input checks": lambda: check_call_inputs(section["inputs"], feed, "bench"),
        "runner.run": lambda: runner.run(args),
        "flatten": flatten,
    }
    if backend == "onnx":
        np_feed = {name: leaf.numpy() for name, leaf in zip(runner.input_leaves, flat, strict=True) if name}
        out_names = [n for n in runner.output_leaves if n is not None]
        calls["runtime (session.run)"] = lambda: runner.session.run(out_names, np_feed)
    elif backend.startswith("executorch"):
        calls["runtime (method.execute)"] = lambda: runner.method.execute(flat)
        outputs = runner.method.execute(flat)
        calls["output clones"] = lambda: [o.clone() for o in outputs if isinstance(o, torch.Tensor)]
    else:
        def bare():
            with torch.no_grad():
                return runner._module(*args)
        calls["runtime (module call)"] = bare
    result = exported.run("decode", **feed)
    calls["unflatten outputs"] = lambda: pytree.tree_unflatten(pytree.tree_leaves(result),
                                                                pytree.tree_structure(result))
    samples = {name: [] for name in calls}
    for fn in calls.values():
        fn()
    for _ in range(max(repeats, 20)):
        for name, fn in calls.items():
            _, seconds = timed(fn)
            samples[name].append(seconds * 1e6)
    return {name: statistics.median(values) for name, values in samples.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backends", nargs="+", default=list(BACKENDS), help="backends to measure")
    parser.add_argument("--repeats", type=int, default=3, help="timed rounds after one warm-up round (median)")
    parser.add_argument("--threads", type=int, default=1, help="threads for torch, ONNX Runtime and ExecuTorch")
    parser.add_argument("--max-cache-len", type=int, default=128, help="the export's max_cache_len")
    parser.add_argument("--max-batch", type=int, default=4, help="the export's max_batch (hfexport's default)")
    parser.add_argument("--prompt", type=int, default=32, help="prompt tokens")
    parser.add_argument("--new-tokens", type=int, default=64, help="tokens to generate")
    parser.add_argument("--small", action="store_true", help="a quick check: hidden 64, 2 layers, vocab 1000")
    parser.add_argument("--no-warm-export", action="store_true",
                        help="skip the untimed tiny export per backend (the first export then pays first-trace costs)")
    parser.add_argument("--no-breakdown", action="store_true", help="skip the per-call breakdown of a decode step")
    parser.add_argument("--json", metavar="PATH", help="also write the table (and settings) as JSON")
    args = parser.parse_args()

    import torch

    import hfexport

    warnings.filterwarnings("ignore")
    torch.set_num_threads(args.threads)
    sizes = SMALL if args.small else FULL
    versions = hfexport._artifact.versions_of(("torch", "transformers", "onnxruntime", "executorch"))
    print(f"# bench_generation: {', '.join(f'{k} {v}' for k, v in versions.items())}; {os.cpu_count()} CPUs")
    described = ", ".join(f"{k.replace('_size', '').replace('num_', '')} {v}" for k, v in sizes.items())
    print(f"seeded Llama ({described}),"
          f" batch 1, prompt {args.prompt}, {args.new_tokens} new tokens (eos_token_id=None), max_cache_len "
          f"{args.max_cache_len}, max_batch {args.max_batch}; median of {args.repeats} rounds after 1 warm-up")
    print(f"toolchain import: {warm_toolchains(args.backends):.1f} s (not counted below)")
    threads = {"torch intra-op": torch.get_num_threads(), "torch inter-op": torch.get_num_interop_threads()}
    if any(b.startswith("executorch") for b in args.backends):
        from executorch.extension.pybindings import portable_lib

        portable_lib._unsafe_reset_threadpool(args.threads)
        threads["ExecuTorch threadpool"] = portable_lib._threadpool_get_thread_count()

    model = seeded_llama(sizes)
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(3, sizes["vocab_size"], (1, args.prompt), generator=generator)
    mask = torch.ones_like(ids)
    options = {"task": "text-generation", "max_cache_len": args.max_cache_len, "max_batch": args.max_batch}

    if not args.no_warm_export:
        tiny = seeded_llama({**SMALL, "hidden_size": 32, "num_hidden_layers": 1, "intermediate_size": 64,
                             "num_attention_heads": 2, "num_key_value_heads": 2, "vocab_size": 100})
        _, seconds = timed(lambda: [hfexport.export(tiny, backend=b, task="text-generation", max_cache_len=16)
                                    for b in args.backends])
        print(f"warm-up exports of a 1-layer Llama: {seconds:.1f} s (not counted below)")

    rows: dict[str, dict] = {}
    exports = {}
    for backend in args.backends:
        exported, seconds = timed(lambda b=backend: hfexport.export(model, backend=b, **options))
        exports[backend] = exported
        rows[backend] = {"export_s": seconds, "planned_bytes": planned_memory(exported)}
        if backend == "onnx":
            settings = set_ort_threads(exported, args.threads)
            threads["ONNX Runtime intra-op / inter-op (prefill, decode)"] = settings
        print(f"exported {backend}: {seconds:.1f} s")

    # ── warm-up round: token ids against eager ────────────────────────────────────────────────────────
    reference, _ = eager_generate(model, ids, mask, args.new_tokens)
    eager_prefill(model, ids, mask)
    for backend, exported in exports.items():
        out = exported.generate(ids, mask, max_new_tokens=args.new_tokens, eos_token_id=None)
        rows[backend]["ids_equal"] = bool(out.shape == reference.shape and torch.equal(out, reference))
        if not rows[backend]["ids_equal"]:
            new = out[0, args.prompt:] if out.shape == reference.shape else out[0]
            first = next((i for i, (a, b) in enumerate(zip(new.tolist(), reference[0, args.prompt:].tolist(),
                                                           strict=False)) if a != b), None)
            print(f"  {backend}: token ids differ from eager's (first new token that differs: {first})")

    # ── timed rounds, interleaved ────────────────────────────────────────────────────────────────────────
    samples: dict[str, dict[str, list[float]]] = {name: {"prefill_s": [], "decode_s": [], "generate_s": []}
                                                  for name in ("eager", *exports)}
    steps = {}
    for _ in range(args.repeats):
        _, stats = eager_generate(model, ids, mask, args.new_tokens)
        samples["eager"]["prefill_s"].append(eager_prefill(model, ids, mask))
        samples["eager"]["decode_s"].append(stats["decode_s"])
        samples["eager"]["generate_s"].append(stats["generate_s"])
        steps["eager"] = stats["decode_steps"]
        for backend, exported in exports.items():
            _, seconds = timed(lambda e=exported: e.generate(ids, mask, max_new_tokens=args.new_tokens,
                                                              eos_token_id=None))
            stats = exported.generation_stats
            samples[backend]["prefill_s"].append(stats["prefill_s"])
            samples[backend]["decode_s"].append(stats["decode_s"])
            samples[backend]["generate_s"].append(seconds)
            steps[backend] = stats["decode_steps"]

    table = []
    eager_tok_s = steps["eager"] / statistics.median(samples["eager"]["decode_s"])
    for name in ("eager", *exports):
        row = rows.get(name, {"export_s": None, "planned_bytes": None, "ids_equal": True})
        decode_s = statistics.median(samples[name]["decode_s"])
        tok_s = steps[name] / decode_s
        planned = row["planned_bytes"]
        table.append({
            "backend": "eager PyTorch generate" if name == "eager" else name,
            "export_s": row["export_s"],
            "prefill_ms": statistics.median(samples[name]["prefill_s"]) * 1e3,
            "decode_tok_s": tok_s,
            "x_eager": tok_s / eager_tok_s,
            "ids_equal": row["ids_equal"],
            "planned_mib": sum(planned.values()) / 2**20 if planned else None,
            "planned_bytes": planned,
            "decode_steps": steps[name],
            "decode_ms_per_token": decode_s / steps[name] * 1e3,
            "generate_ms": statistics.median(samples[name]["generate_s"]) * 1e3,
        })

    def cell(value, spec):
        return format("-", ">" + spec.split(".")[0]) if value is None else format(value, spec)

    print(f"\n{'backend':<24} | {'export s':>8} | {'prefill ms':>10} | {'decode tok/s':>12} | {'x eager':>7} | "
          f"{'ids equal':>9} | {'planned MiB':>11}")
    print("-" * 100)
    for r in table:
        print(f"{r['backend']:<24} | {cell(r['export_s'], '8.1f')} | {r['prefill_ms']:>10.2f} | "
              f"{r['decode_tok_s']:>12.1f} | {r['x_eager']:>6.2f}x | {str(r['ids_equal']):>9} | "
              f"{cell(r['planned_mib'], '11.2f')}")
    print(f"\ndecode tok/s = {steps['eager']} decode steps / time from the first new token to the last (batch 1); "
          "prefill: the exported prefill program vs one eager forward of the prompt (logits_to_keep=1)")
    print("whole generate call, median ms: " + ", ".join(f"{r['backend']} {r['generate_ms']:.1f}" for r in table))
    for r in table:
        if r["planned_bytes"]:
            print(f"{r['backend']} planned memory (max_batch {args.max_batch} x max_cache_len {args.max_cache_len}): "
                  + ", ".join(f"{k} {v / 2**20:.2f} MiB" for k, v in r["planned_bytes"].items())
                  + " (manifest['components'][...]['executorch']['planned_memory_bytes'])")
    print("threads in effect: " + "; ".join(f"{k} {v}" for k, v in threads.items()))
    goal = [r for r in table if r["backend"] in ("onnx", "executorch-xnnpack")]
    if goal:
        print("goal decode >= 1.5x eager: " + ", ".join(
            f"{r['backend']} {'met' if r['x_eager'] >= 1.5 else 'NOT met'} ({r['x_eager']:.2f}x)" for r in goal))

    breakdown = {}
    if not args.no_breakdown:
        past = min(args.prompt + args.new_tokens // 2, args.max_cache_len - 1)
        print(f"\n## One decode call at {past} cached positions, median us (eager generate: "
              f"{table[0]['decode_ms_per_token'] * 1e3:.0f} us per decode step, loop included)")
        for backend, exported in exports.items():
            breakdown[backend] = decode_breakdown(backend, exported, ids, mask, past, args.repeats)
            row = next(r for r in table if r["backend"] == backend)
            print(f"{backend:<20} per step in generate {row['decode_ms_per_token'] * 1e3:>8.0f}  | "
                  + "  ".join(f"{k} {v:.0f}" for k, v in breakdown[backend].items()))

    if args.json:
        with open(args.json, "w") as file:
            json.dump({"model": sizes, "batch": 1, "prompt": args.prompt, "new_tokens": args.new_tokens,
                       "max_cache_len": args.max_cache_len, "max_batch": args.max_batch, "repeats": args.repeats,
                       "versions": versions, "threads": {k: str(v) for k, v in threads.items()},
                       "rows": table, "decode_call_breakdown_us": breakdown}, file, indent=2)
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
