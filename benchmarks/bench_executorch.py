"""ExecuTorch backend benchmark, measured in one run on this machine.

1. all-MiniLM-L6-v2 latency on the ExecuTorch runtime (``executorch-xnnpack``) against eager PyTorch, same inputs,
   same thread count (median of ``--repeat`` calls after warm-up), with the max abs difference.
2. Export wall time of ``hfexport.export(..., backend="executorch-xnnpack")`` against the peer
   ``transformers.exporters.ExecutorchExporter`` (static and ``dynamic=True``), after both toolchains are imported
   (the first ExecuTorch import costs tens of seconds and would otherwise go to whichever runs first).
3. all-MiniLM-L6-v2 at batch 1 x 128, static: the delegated fraction (delegated compute nodes / all compute nodes)
   and the latency of hfexport's program against the peer's and eager (``--static-only``: this section alone).
4. With ``--matrix``: the delegated fraction (delegated compute nodes / all compute nodes) of every architecture of
   the tiny-config matrix in tests/executorch/test_executorch.py, exported with ``dynamic=True`` and checked at a second shape.

Usage:
    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/bench_executorch.py [--repeat 50] [--threads 2] [--matrix] [--no-peer] [--static-only]

Only this benchmark imports the peer (``transformers.exporters``); the product never does.
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402

import hfexport  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def timed(fn):
    start = time.perf_counter()
    result = fn()
    return result, time.perf_counter() - start


def max_abs_diff(a, b) -> float:
    import torch.utils._pytree as pytree

    la = [x for x in pytree.tree_leaves(a) if isinstance(x, torch.Tensor)]
    lb = [x for x in pytree.tree_leaves(b) if isinstance(x, torch.Tensor)]
    return max(float((x.double() - y.double()).abs().max()) for x, y in zip(la, lb, strict=True))


def minilm_inputs():
    from transformers import AutoTokenizer

    from hfexport_dynamo.demo import CHECK_SENTENCES, TRACE_SENTENCES, minilm_demo, minilm_path

    model, _, _ = minilm_demo()
    tokenizer = AutoTokenizer.from_pretrained(minilm_path())

    def encode(sentences, length):
        return dict(tokenizer(sentences, padding="max_length", truncation=True, max_length=length,
                              return_tensors="pt"))

    return model, encode(TRACE_SENTENCES, 8), encode(CHECK_SENTENCES, 17)


def warm_toolchains(peer: bool) -> float:
    start = time.perf_counter()
    import executorch.exir  # noqa: F401
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner  # noqa: F401
    from executorch.runtime import Runtime

    Runtime.get()
    import hfexport_executorch.exporter_executorch  # noqa: F401

    if peer:
        import transformers.exporters.exporter_executorch  # noqa: F401
    return time.perf_counter() - start


def warm_exports(peer: bool) -> None:
    """One tiny export with each exporter first: lazy imports and first-call costs go to neither timed export."""
    import transformers

    torch.manual_seed(0)
    config = transformers.BertConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=37,
                                     vocab_size=100, max_position_embeddings=64)
    tiny = transformers.BertModel(config).eval()
    inputs = {"input_ids": torch.randint(0, 100, (2, 8)), "attention_mask": torch.ones(2, 8, dtype=torch.long)}
    hfexport.export(tiny, copy.deepcopy(inputs), backend="executorch-xnnpack", dynamic=True)
    if peer:
        export_peer(tiny, inputs, True)


def export_peer(model, inputs, dynamic: bool):
    from transformers.exporters import ExecutorchConfig, ExecutorchExporter

    return ExecutorchExporter().export(model, copy.deepcopy(inputs), config=ExecutorchConfig(backend="xnnpack",
                                                                                               dynamic=dynamic))


def bench_minilm(repeat: int, peer: bool) -> None:
    model, trace, second = minilm_inputs()
    print(f"toolchain import (executorch, xnnpack, runtime{', peer' if peer else ''}): "
          f"{warm_toolchains(peer):.1f} s (not counted below)")

    warm_exports(peer)
    print("\n## Export wall time, all-MiniLM-L6-v2 (xnnpack, traced at batch 2 x seq 8)")
    print(f"{'exporter':<44} {'static s':>9} {'dynamic s':>10}")
    ours: dict = {}
    theirs: dict = {}
    for dynamic in (False, True):  # alternating, so that drifting load on a shared machine hits both alike
        ours[dynamic], ours[f"{dynamic}_s"] = timed(lambda d=dynamic: hfexport.export(
            model, copy.deepcopy(trace), backend="executorch-xnnpack", dynamic=d))
        if peer:
            try:
                theirs[dynamic], theirs[f"{dynamic}_s"] = timed(lambda d=dynamic: export_peer(model, trace, d))
            except Exception as exc:  # report, do not hide: the figure is then missing
                theirs[f"{dynamic}_s"] = float("nan")
                print(f"  peer dynamic={dynamic} failed: {type(exc).__name__}: {str(exc).splitlines()[0][:160]}")
    print(f"{'hfexport executorch-xnnpack':<44} {ours['False_s']:>9.1f} {ours['True_s']:>10.1f}")
    if peer:
        print(f"{'transformers.exporters.ExecutorchExporter':<44} {theirs['False_s']:>9.1f} {theirs['True_s']:>10.1f}")

    for dynamic in (False, True):
        section = ours[dynamic].manifest["executorch"]
        print(f"hfexport dynamic={dynamic}: delegated {section['delegated_nodes']}/"
              f"{section['delegated_nodes'] + section['portable_nodes']} ({section['delegated_fraction']:.1%}) in "
              f"{section['delegates']} delegates; portable ops: {', '.join(list(section['portable_ops'])[:6])} ...")

    print(f"\n## Latency, all-MiniLM-L6-v2, {torch.get_num_threads()} thread(s) for torch and for ExecuTorch, "
          f"median of {repeat} calls (interleaved: one call of each runtime per round)")
    print(f"{'shape':<17} {'runtime':<42} {'median ms':>10} {'vs eager':>9} {'max abs diff':>13}")
    with torch.no_grad():
        for name, inputs in (("batch 2 x seq 8", trace), ("batch 3 x seq 17", second)):
            runners = {"eager PyTorch": lambda i=inputs: model(**i)}
            candidates = [("hfexport static", ours[False]), ("hfexport dynamic", ours[True])]
            candidates += [(f"peer {'dynamic' if d else 'static'}", e) for d, e in theirs.items() if not isinstance(d, str)]
            for label, exported in candidates:
                if "static" in label and inputs is not trace:
                    continue  # a static program runs its traced shape only
                runners[f"{label} (ExecuTorch+XNNPACK)"] = lambda e=exported, i=inputs: e(**i)
            eager_out = model(**inputs)
            diffs = {}
            for label, run in list(runners.items()):
                try:
                    diffs[label] = max_abs_diff(run(), eager_out)
                except Exception as exc:  # report, do not hide
                    print(f"  {label} failed: {type(exc).__name__}: {str(exc).splitlines()[0][:160]}")
                    runners.pop(label)
            samples = interleaved(runners, repeat)
            eager = statistics.median(samples["eager PyTorch"])
            for label, times in samples.items():
                ms = statistics.median(times)
                print(f"{name:<17} {label:<42} {ms:>10.2f} {eager / ms:>8.2f}x {diffs[label]:>13.2e}")


def bench_static_128(repeat: int, peer: bool) -> None:
    """Batch 1 x 128, static: the delegated fraction and latency of hfexport's program against the peer's and eager."""
    from hfexport_dynamo.demo import minilm_demo

    model, _, _ = minilm_demo()
    torch.manual_seed(0)
    inputs = {"input_ids": torch.randint(1000, 20000, (1, 128)), "token_type_ids": torch.zeros(1, 128, dtype=torch.long),
              "attention_mask": torch.ones(1, 128, dtype=torch.long)}
    inputs["attention_mask"][0, 100:] = 0  # padding: the mask path is exercised
    ours, seconds = timed(lambda: hfexport.export(model, copy.deepcopy(inputs), backend="executorch-xnnpack"))
    section = ours.manifest["executorch"]
    total = section["delegated_nodes"] + section["portable_nodes"]
    print("\n## all-MiniLM-L6-v2, batch 1 x 128 static (xnnpack)")
    portable = ", ".join(f"{op.split('::')[-1]}x{n}" for op, n in section["portable_ops"].items())
    print(f"hfexport: delegated {section['delegated_nodes']}/{total} compute nodes ({section['delegated_fraction']:.1%}) "
          f"in {section['delegates']} delegates, export {seconds:.1f} s; portable ops: {portable}")
    runners = {"eager PyTorch": lambda: model(**inputs), "hfexport (ExecuTorch+XNNPACK)": lambda: ours(**inputs)}
    if peer:
        theirs, seconds = timed(lambda: export_peer(model, inputs, False))
        print(f"peer: export {seconds:.1f} s")
        runners["peer (ExecuTorch+XNNPACK)"] = lambda: theirs(**inputs)
    with torch.no_grad():
        eager_out = model(**inputs)
        diffs = {label: max_abs_diff(run(), eager_out) for label, run in runners.items()}
        samples = interleaved(runners, repeat)
    eager = statistics.median(samples["eager PyTorch"])
    print(f"{'runtime':<32} {'median ms':>10} {'vs eager':>9} {'max abs diff':>13}")
    for label, times in samples.items():
        ms = statistics.median(times)
        print(f"{label:<32} {ms:>10.2f} {eager / ms:>8.2f}x {diffs[label]:>13.2e}")
    if peer:
        ratio = statistics.median(samples["hfexport (ExecuTorch+XNNPACK)"]) / statistics.median(
            samples["peer (ExecuTorch+XNNPACK)"])
        print(f"hfexport / peer latency: {ratio:.2f}")


def interleaved(runners: dict, repeat: int, warmup: int = 3) -> dict[str, list[float]]:
    """Milliseconds per call of each runner, one call of each per round, so that load from other processes on a
    shared machine hits them alike."""
    for _ in range(warmup):
        for run in runners.values():
            run()
    samples: dict[str, list[float]] = {label: [] for label in runners}
    for _ in range(repeat):
        for label, run in runners.items():
            start = time.perf_counter()
            run()
            samples[label].append((time.perf_counter() - start) * 1e3)
    return samples


def bench_matrix() -> None:
    sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "tests" / "executorch")]
    from test_executorch import MATRIX, MATRIX_EXTRA, _tiny

    from hfexport_dynamo.inputs import dummy_inputs

    print("\n## Tiny-config matrix (xnnpack, dynamic=True, 1 layer each): delegated fraction")
    print(f"{'model':<11} {'delegated':>10} {'fraction':>9} {'delegates':>9} {'export s':>9} {'diff traced':>12} "
          f"{'diff 2nd':>9}  top portable ops")
    for kind, (batch, seq) in {**MATRIX, **MATRIX_EXTRA}.items():
        model = _tiny(kind)
        trace = dummy_inputs(model, 2, 8, seed=0)
        try:
            exported, seconds = timed(lambda m=model, t=trace: hfexport.export(
                m, copy.deepcopy(t), backend="executorch-xnnpack", dynamic=True))
        except Exception as exc:
            print(f"{kind:<11} FAILED {type(exc).__name__}: {str(exc).splitlines()[0][:120]}")
            continue
        section = exported.manifest["executorch"]
        diffs = [exported.verify(dummy_inputs(model, b, s, seed=i), atol=1e-4, rtol=0).max_abs_diff
                 for i, (b, s) in enumerate(((2, 8), (batch, seq)))]
        total = section["delegated_nodes"] + section["portable_nodes"]
        top = ", ".join(f"{op.split('::')[-1]}x{n}" for op, n in list(section["portable_ops"].items())[:4])
        print(f"{kind:<11} {section['delegated_nodes']:>4}/{total:<5} {section['delegated_fraction']:>9.1%} "
              f"{section['delegates']:>9} {seconds:>9.1f} {diffs[0]:>12.1e} {diffs[1]:>9.1e}  {top}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=30, help="timed calls per latency figure")
    parser.add_argument("--threads", type=int, default=1,
                        help="threads for torch and for ExecuTorch's XNNPACK threadpool (1: robust on a shared machine)")
    parser.add_argument("--matrix", action="store_true", help="also export the tiny-config matrix")
    parser.add_argument("--no-peer", action="store_true", help="skip transformers.exporters.ExecutorchExporter")
    parser.add_argument("--static-only", action="store_true",
                        help="only the batch 1 x 128 static comparison (delegated fraction, latency)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    from executorch.extension.pybindings import portable_lib

    portable_lib._unsafe_reset_threadpool(args.threads)
    versions = hfexport._artifact.versions_of(("torch", "transformers", "executorch"))
    print(f"# bench_executorch: {', '.join(f'{k} {v}' for k, v in versions.items())}; {os.cpu_count()} CPUs")
    if args.static_only:
        warm_toolchains(not args.no_peer)
    else:
        bench_minilm(args.repeat, peer=not args.no_peer)
    bench_static_128(args.repeat, peer=not args.no_peer)
    if args.matrix:
        bench_matrix()


if __name__ == "__main__":
    main()
