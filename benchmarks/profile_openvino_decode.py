"""Where an OpenVINO decode step goes: hfexport's text-generation IR (growing cache, default) of the seeded toy Llama
(benchmarks/bench_generation.py's, 58 M parameters) on the CPU plugin, one thread, f32 inference and KV cache, with
its performance counters (``PERF_COUNT``): wall ms per decode step and per-node-type ms, averaged over 8 steps after
a prefill of 64 and of 1,000 tokens. ``FullyConnected`` is the weight matmuls; ``ScaledDotProductAttentionWithKVCache``
is the plugin's fused attention with its in-place cache (what ``ReadValue`` -> ``Concat`` -> ``ScaledDotProductAttention``
-> ``Assign`` becomes).

Run: HF_HUB_OFFLINE=1 uv run python benchmarks/profile_openvino_decode.py
"""

from __future__ import annotations

import collections
import os
import sys
import time
import warnings

STEPS = 8


def main() -> None:
    import numpy as np
    import openvino

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from bench_generation import FULL, seeded_llama

    import hfexport

    warnings.filterwarnings("ignore")
    model = seeded_llama(FULL)
    exported = hfexport.export(model, backend="openvino", task="text-generation", max_cache_len=1100, verify=False)
    core = openvino.Core()
    compiled = core.compile_model(core.read_model(exported.components["decoder"].runner.path), "CPU", {
        "INFERENCE_PRECISION_HINT": "f32", "KV_CACHE_PRECISION": "f32", "INFERENCE_NUM_THREADS": 1, "PERF_COUNT": True})
    request = compiled.create_infer_request()
    print(f"# profile_openvino_decode: openvino {openvino.__version__}; load average {os.getloadavg()[0]:.2f}")
    for prompt in (64, 1000):
        request.reset_state()
        ids = np.random.default_rng(0).integers(3, FULL["vocab_size"], (1, prompt))
        request.infer({"input_ids": ids, "attention_mask": np.ones((1, prompt), np.int64),
                       "position_ids": np.arange(prompt)[None], "beam_idx": np.zeros(1, np.int32)})
        per_type: collections.Counter = collections.Counter()
        start = time.perf_counter()
        for k in range(STEPS):
            held = prompt + k
            request.infer({"input_ids": np.array([[5]]), "attention_mask": np.ones((1, held + 1), np.int64),
                           "position_ids": np.array([[held]]), "beam_idx": np.zeros(1, np.int32)})
            for node in request.profiling_info:
                per_type[node.node_type] += node.real_time.total_seconds() * 1e3 / STEPS
        wall = (time.perf_counter() - start) / STEPS * 1e3
        print(f"near {prompt} positions: {wall:.1f} ms per step (wall); per node type, ms: "
              + ", ".join(f"{k} {v:.2f}" for k, v in per_type.most_common(6)))


if __name__ == "__main__":
    main()
