"""Quantization benchmark: float against quantized all-MiniLM-L6-v2 (and a tiny Llama) on ONNX Runtime and ExecuTorch,
in one run.

Exports the bundled all-MiniLM-L6-v2 (dynamic batch up to 16 and sequence up to 128) as float and with each recipe of
both backends, saves every artifact, loads it back, and prints per artifact:
  * the size of its program files (``model.onnx`` + ``model.onnx.data``; ``model.pte``) and its ratio to the float
    artifact of the same runtime (the acceptance: at most ~35%);
  * latency at batch 1 x seq 128 on one thread (ONNX Runtime: 1 intra-op thread; ExecuTorch: an XNNPACK threadpool
    of 1; torch: 1 thread for eager), median of ``--runs`` calls interleaved across all artifacts after warm-up, and
    the speed-up over the float artifact of the same runtime (goal: int8 ORT at least 1.5x the float ORT);
  * the sentence embeddings' (mean pooling) cosine similarity with float eager over 16 fixed sentences (mean, min),
    and the export's own verification (cosine of ``last_hidden_state`` on the traced inputs).

Then a seeded tiny Llama (tests/helpers.py ``tiny_model("llama")``) as a text-generation export with each recipe
that suits a decoder: program size, the first 10 greedy tokens' agreement with float eager ``generate`` (prompt of
6), the ``decoder`` program's top-1 agreement on its verification inputs (its one program, prefill and decode), and
the median time of a 10-token ``generate``.

Run: HF_HUB_OFFLINE=1 uv run python benchmarks/bench_quantization.py [--runs 30] [--no-executorch] [--no-llama]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ["HF_HUB_OFFLINE"] = "1"
sys.path.insert(0, str(Path(__file__).parents[1] / "tests"))  # the 16 sentences and the pooling of the tests
sys.path.insert(0, str(Path(__file__).parent))

from bench_onnx import interleaved_latency  # noqa: E402  (one timing loop for the ORT benchmarks)


def one_thread_ort(exported) -> None:
    """Reopen the artifact's ONNX Runtime session with 1 intra-op and 1 inter-op thread (its runner keeps the
    session optimizers the manifest disables)."""
    import onnxruntime

    runner = exported.default_component.runner
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    options.log_severity_level = 3
    runner.session_options = options
    runner.open()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=30, help="timed calls per artifact (median)")
    parser.add_argument("--no-executorch", action="store_true", help="ONNX Runtime only")
    parser.add_argument("--no-llama", action="store_true", help="all-MiniLM-L6-v2 only")
    args = parser.parse_args()

    import torch
    from quantization_helpers import (
        CALIBRATION_SENTENCES,
        SENTENCES,
        artifact_bytes,
        embedding_cosines,
        minilm,
    )

    import hfexport

    torch.set_num_threads(1)
    model, encode = minilm()
    trace = encode(SENTENCES[:2])
    words = "hfexport turns models into artifacts and runs them back on their runtime".split()
    text = " ".join(words[j % len(words)] for j in range(4 * 128))
    bench = encode([text])
    bench = {k: v[:, :128] for k, v in bench.items()}  # batch 1 x seq 128
    assert bench["input_ids"].shape == (1, 128)

    calibration = [encode(CALIBRATION_SENTENCES)]  # static recipes: other sentences than the 16 compared
    cases = [("onnx", "float", {}), ("onnx", "int8-dynamic", {"quantize": "int8-dynamic"}),
             ("onnx", "int8-dynamic-per-tensor", {"quantize": "int8-dynamic-per-tensor"}),
             ("onnx", "int8-static", {"quantize": hfexport.Quantization("int8-static", calibration=calibration)})]
    if not args.no_executorch:
        cases += [("executorch-xnnpack", "float", {}),
                  ("executorch-xnnpack", "int8-dynamic", {"quantize": "int8-dynamic"}),
                  ("executorch-xnnpack", "int8", {"quantize": hfexport.Quantization("int8", calibration=calibration)}),
                  ("executorch-xnnpack", "8da4w", {"quantize": "8da4w"}),
                  ("executorch-xnnpack", "8da8w + 8w embeddings",
                   {"quantize": hfexport.Quantization("8da8w", embedding="8w")})]
    if not args.no_executorch:
        from executorch.extension.pybindings import portable_lib

        portable_lib._unsafe_reset_threadpool(1)
    rows, calls = [], {"eager (torch, 1 thread)": lambda: model(**bench)}
    with tempfile.TemporaryDirectory(prefix="hfexport-bench-quantization-") as tmp:
        # Bounded dims: ExecuTorch plans memory for the largest shapes (static int8 leaves its quantize and
        # dequantize ops on portable kernels, each planned at the bounds).
        from torch.export import Dim

        dims = {"batch": Dim("batch", min=1, max=16), "seq": Dim("seq", min=1, max=128)}
        shapes = {name: {0: dims["batch"], 1: dims["seq"]} for name in trace}
        for backend, recipe, options in cases:
            start = time.perf_counter()
            try:
                exported = hfexport.export(model, trace, backend=backend, dynamic_shapes=shapes, **options)
            except hfexport.ExportError as exc:  # reported, and the other rows still measured
                print(f"FAILED {backend} {recipe}: {str(exc).splitlines()[0]}", flush=True)
                continue
            seconds = time.perf_counter() - start
            path = exported.save_pretrained(Path(tmp) / f"{backend}-{recipe}".replace(" ", "_"))
            loaded = hfexport.load(path)
            if backend == "onnx":
                one_thread_ort(loaded)
            size = artifact_bytes(path, (".onnx", ".onnx.data") if backend == "onnx" else (".pte",))
            cosines = embedding_cosines(loaded, model, encode)
            verification = exported.manifest["verification"]
            name = f"{backend} {recipe}"
            calls[name] = lambda loaded=loaded: loaded(**bench)
            rows.append({"name": name, "backend": backend, "recipe": recipe, "size": size, "export_s": seconds,
                         "cos_mean": float(cosines.mean()), "cos_min": float(cosines.min()),
                         "verify": verification.get("cosine")})
            print(f"exported {name} in {seconds:.1f}s: {size / 1e6:.1f} MB", flush=True)
        with torch.no_grad():
            latency = interleaved_latency(calls, args.runs)
    float_of = {r["backend"]: r for r in rows if r["recipe"] == "float"}
    print(f"\n## all-MiniLM-L6-v2, batch 1 x seq 128, 1 thread, median of {args.runs} interleaved calls")
    print(f"eager PyTorch (float, 1 thread): {latency['eager (torch, 1 thread)'] * 1e3:.1f} ms\n")
    print("| artifact | size MB | size / float | latency ms | speed-up / float | embeddings cosine mean / min "
          "(16 sentences) | verification cosine | export s |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        base = float_of.get(r["backend"], r)
        ms, base_ms = latency[r["name"]] * 1e3, latency[base["name"]] * 1e3
        verify = "" if r["verify"] is None else f"{r['verify']:.4f}"
        print(f"| {r['name']} | {r['size'] / 1e6:.1f} | {r['size'] / base['size']:.1%} | {ms:.1f} | "
              f"{base_ms / ms:.2f}x | {r['cos_mean']:.4f} / {r['cos_min']:.4f} | {verify} | {r['export_s']:.1f} |")
    print()
    for r in rows:
        if r["backend"] == "onnx" and r["recipe"] != "float" and "onnx" in float_of:
            speedup = latency[float_of["onnx"]["name"]] / latency[r["name"]]
            print(f"goal int8 ORT >= 1.5x float ORT, {r['recipe']}: {speedup:.2f}x "
                  f"({'met' if speedup >= 1.5 else 'NOT met'}); every sentence >= 0.99: "
                  f"{'yes' if r['cos_min'] >= 0.99 else 'no'}; <= 35% of float: {'yes' if r['size'] <= 0.35 * float_of['onnx']['size'] else 'no'}")
    if not args.no_llama:
        llama_table(args)


def llama_table(args) -> None:
    """The tiny Llama rows: size, first-10-token agreement, decoder top-1 agreement, 10-token generate time."""
    import statistics

    import torch
    from quantization_helpers import artifact_bytes, first_token_agreement

    import hfexport
    from helpers import tiny_model

    model = tiny_model("llama")
    prompt = torch.randint(3, 100, (1, 6), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected = model.generate(input_ids=prompt, attention_mask=torch.ones_like(prompt), do_sample=False,
                                  max_new_tokens=10, eos_token_id=None)
    cases = [("onnx", "float", None), ("onnx", "int8-dynamic", "int8-dynamic"),
             ("onnx", "int8-dynamic-per-tensor", "int8-dynamic-per-tensor")]
    if not args.no_executorch:
        cases += [("executorch-xnnpack", "float", None), ("executorch-xnnpack", "8da4w", "8da4w"),
                  ("executorch-xnnpack", "8da4w + 4w embeddings", hfexport.Quantization("8da4w", embedding="4w")),
                  ("executorch-xnnpack", "8da8w + 8w embeddings", hfexport.Quantization("8da8w", embedding="8w"))]
    rows = []
    with tempfile.TemporaryDirectory(prefix="hfexport-bench-quantization-llama-") as tmp:
        for backend, recipe, quantize in cases:
            try:
                exported = hfexport.export(model, backend=backend, task="text-generation", max_cache_len=32,
                                           quantize=quantize)
            except hfexport.ExportError as exc:
                print(f"FAILED tiny Llama {backend} {recipe}: {str(exc).splitlines()[0]}", flush=True)
                continue
            path = exported.save_pretrained(Path(tmp) / f"{backend}-{recipe}".replace(" ", "_"))
            size = artifact_bytes(path, (".onnx", ".onnx.data") if backend == "onnx" else (".pte",))
            got = exported.generate(prompt, max_new_tokens=10, eos_token_id=None)
            times = []
            for _ in range(5):
                start = time.perf_counter()
                exported.generate(prompt, max_new_tokens=10, eos_token_id=None)
                times.append(time.perf_counter() - start)
            top1 = exported.manifest["components"]["decoder"]["verification"].get("top1_agreement")
            rows.append((backend, recipe, size, first_token_agreement(got, expected, prompt.shape[1]), top1,
                         statistics.median(times)))
            print(f"exported tiny Llama {backend} {recipe}: {size / 1e3:.0f} kB", flush=True)
    floats = {r[0]: r[2] for r in rows if r[1] == "float"}
    print("\n## tiny seeded Llama (vocab 100, hidden 32, 2 layers), text-generation, prompt 6, 10 greedy tokens")
    print("| artifact | size kB | size / float | first 10 tokens = float eager | decoder top-1 (verification) | "
          "generate 10 tokens ms |")
    print("|---|---:|---:|---:|---:|---:|")
    for backend, recipe, size, agreement, top1, seconds in rows:
        print(f"| {backend} {recipe} | {size / 1e3:.0f} | {size / floats.get(backend, size):.1%} | {agreement:.0%} | "
              f"{'' if top1 is None else f'{top1:.2f}'} | {seconds * 1e3:.1f} |")


if __name__ == "__main__":
    main()
