"""How often one export crosses between hfexport's packages (issue 27's measure of the architecture).

Runs ``hfexport.export(model, backend=..., task=...)`` on a tiny seeded Llama under ``sys.setprofile`` and counts
the calls whose caller and callee live in different hfexport packages (hfexport, hfexport_dynamo, hfexport_onnx,
hfexport_executorch, ...), each edge (caller function -> callee function) once however often it repeats.
Calls into third-party code and back (torch calling a patch) are not crossings between our packages and are
left out. Prints the count, the edges by package pair, and with ``--edges`` every edge.

    uv run python benchmarks/count_package_crossings.py                       # onnx, text-generation
    uv run python benchmarks/count_package_crossings.py --backend dynamo --task none --edges
"""

from __future__ import annotations

import argparse
import collections
import os
import sys
import threading

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def _package(filename: str) -> str | None:
    """The hfexport package a source file belongs to (``hfexport_onnx``), else None."""
    parts = filename.replace("\\", "/").split("/")
    for i, part in enumerate(parts[:-1]):
        if part == "src" and i + 1 < len(parts) and parts[i + 1].startswith("hfexport"):
            return parts[i + 1]
    return None


def count(backend: str, task: str | None) -> dict[tuple[str, str], set[tuple[str, str]]]:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    import hfexport

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    model = LlamaForCausalLM(config).eval()
    inputs = None if task else {"input_ids": torch.randint(0, 128, (1, 8))}
    edges: dict[tuple[str, str], set[tuple[str, str]]] = collections.defaultdict(set)

    def profile(frame, event, arg):
        if event != "call":
            return
        callee = _package(frame.f_code.co_filename)
        caller_frame = frame.f_back
        if callee is None or caller_frame is None:
            return
        caller = _package(caller_frame.f_code.co_filename)
        if caller is not None and caller != callee:
            edges[caller, callee].add((f"{caller_frame.f_code.co_name}", f"{frame.f_code.co_name}"))

    options = {"task": task, "max_cache_len": 32} if task else {}
    sys.setprofile(profile)
    threading.setprofile(profile)
    try:
        hfexport.export(model, inputs, backend=backend, **options)
    finally:
        sys.setprofile(None)
        threading.setprofile(None)
    return edges


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backend", default="onnx")
    parser.add_argument("--task", default="text-generation", help="a task, or 'none' for one forward pass")
    parser.add_argument("--edges", action="store_true", help="print every edge")
    args = parser.parse_args()
    task = None if args.task == "none" else args.task
    edges = count(args.backend, task)
    total = sum(len(v) for v in edges.values())
    print(f"export(backend={args.backend!r}, task={task!r}): {total} package crossings (distinct caller -> callee "
          "functions across hfexport packages)")
    for (caller, callee), pairs in sorted(edges.items(), key=lambda kv: -len(kv[1])):
        print(f"  {caller:>20} -> {callee:<20} {len(pairs)}")
        if args.edges:
            for a, b in sorted(pairs):
                print(f"      {a} -> {b}")


if __name__ == "__main__":
    main()
