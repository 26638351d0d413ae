"""Foundation benchmark: CLI start-up and the dynamo export of all-MiniLM-L6-v2 against the peer.

Prints, measured in this run:
  * wall time of `hfexport --help` and `hfexport backends` (median of N runs; target < 1 s), and which
    heavy modules each imported (must be none of torch's exporters, onnx, executorch);
  * dynamo export time of MiniLM (dynamic=True) with hfexport and with the peer
    `transformers.exporters.DynamoExporter`, interleaved, median of N runs, and their ratio (goal <= 1.0).

Run: uv run python benchmarks/bench_dynamo.py [--runs 3]
(This script may import the peer; the product never does.)
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

os.environ["HF_HUB_OFFLINE"] = "1"


def cli_time(args: list[str], runs: int) -> float:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run([sys.executable, "-m", "hfexport.cli", *args], check=True, capture_output=True)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def heavy_imports(args: list[str]) -> list[str]:
    code = ("import sys; from hfexport import cli\n"
            f"try:\n    cli.main({args!r})\nexcept SystemExit:\n    pass\n"
            "print([m for m in ('torch', 'torch.export', 'torch.onnx', 'onnx', 'onnxscript', 'onnxruntime', "
            "'executorch', 'transformers') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    return eval(out.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()

    for cmd in (["--help"], ["backends"]):
        print(f"hfexport {' '.join(cmd):<10} median {cli_time(cmd, max(5, args.runs)):.3f} s   "
              f"heavy modules imported: {heavy_imports(cmd)}")

    import torch
    from transformers.exporters import DynamoConfig as PeerConfig
    from transformers.exporters import DynamoExporter as PeerExporter

    import hfexport
    from hfexport_dynamo.demo import minilm_demo

    model, inputs, _ = minilm_demo()
    ours, peer = [], []
    for _ in range(args.runs):  # interleaved so that both see the same machine state
        start = time.perf_counter()
        hfexport.export(model, inputs, dynamic=True)
        ours.append(time.perf_counter() - start)
        start = time.perf_counter()
        PeerExporter().export(model, dict(inputs), PeerConfig(dynamic=True))
        peer.append(time.perf_counter() - start)
    o, p = statistics.median(ours), statistics.median(peer)
    print(f"MiniLM dynamo export (dynamic=True), median of {args.runs}: hfexport {o:.2f} s, "
          f"peer transformers.exporters {p:.2f} s, ratio {o / p:.2f} (goal <= 1.0); torch {torch.__version__}")


if __name__ == "__main__":
    main()
