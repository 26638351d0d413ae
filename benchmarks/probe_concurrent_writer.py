"""Concurrent-writer probe (issue 43): a writer swaps the artifact's files while hfexport loads, runs, verifies and
generates; no attempt may change outputs silently, and the process may never crash.

For each backend, a worker process exports a seeded tiny Llama with ``task="text-generation"`` twice (seed 0, the
artifact under test; seed 1, the "other" files a writer puts in their place, same names and layout), records
greedy ids of the seed-0 artifact, then, for every file the manifest names (``files_sha256``) and ``export.json``
itself, and for each writer and operation, makes ``--attempts`` attempts while a thread writes that file as fast as
it can:

  writers      ``replace``: a copy of the other file, then the original, each moved over the path with
               ``os.replace`` (a writer in a shared directory); ``in-place``: the other bytes, then the original
               ones, written into the same inode (``open("r+b")``, truncated: a writer on a mounted volume).
  operations   ``generate``: ``hfexport.load(dir).generate(ids, max_new_tokens=6)`` against the ids recorded
               before any swap; ``verify``: ``hfexport.load(dir).verify_stored()``, every report passing.

Each attempt ends as ``ok`` (the recorded ids; every stored check passes), ``refused`` (an hfexport error: the
file changed while it was loaded, a manifest or untrusted-artifact error), ``flagged`` (``verify_stored`` ran and
reported a failure, so the change is visible), or a failure of the probe: ``silent`` (other ids, or passing reports
from other bytes cannot be told apart: counted only for ``generate``), ``other error`` (any other exception,
named in the output) or a crash (the worker dies by a signal: its exit status is printed).

    uv run python benchmarks/probe_concurrent_writer.py                       # every installed backend
    uv run python benchmarks/probe_concurrent_writer.py --backend onnx --attempts 3 --json probe.json
    uv run python benchmarks/probe_concurrent_writer.py --backend executorch-xnnpack --tied   # with a model.ptd

Prints, per backend, the files probed, attempts, swaps and the outcome counts, then one verdict line. Exit status 1
when any attempt changed outputs silently, failed with another error, or a worker crashed.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
BACKENDS = ("dynamo", "onnx", "executorch-xnnpack", "openvino")
PROMPT = [[3, 17, 42, 9, 100]]


def export_tiny_llama(backend: str, seed: int, directory: Path, tied: bool = False) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    import hfexport

    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                         tie_word_embeddings=tied,
                         # tied at the default init (0.02), every seed repeats the last token (the table's self-
                         # similarity dominates the logits): larger layer weights make the seeds' ids differ
                         initializer_range=1.0 if tied else 0.02)
    model = LlamaForCausalLM(config).eval()
    hfexport.export(model, backend=backend, task="text-generation", max_cache_len=32).save_pretrained(directory)


class Writer(threading.Thread):
    """Writes ``path`` with the ``other`` bytes, then the ``original`` ones, until stopped; counts the writes."""

    def __init__(self, path: Path, original: bytes, other: bytes, mode: str) -> None:
        super().__init__(daemon=True)
        self.path, self.contents, self.mode = path, (other, original), mode
        self.halt, self.swaps = threading.Event(), 0

    def run(self) -> None:
        staged = self.path.with_name(self.path.name + ".staged")
        while not self.halt.is_set():
            for data in self.contents:
                if self.mode == "replace":
                    staged.write_bytes(data)
                    os.replace(staged, self.path)
                else:
                    with open(self.path, "r+b") as file:
                        file.write(data)
                        file.truncate(len(data))
                self.swaps += 1

    def stop(self, original: bytes) -> None:
        self.halt.set()
        self.join()
        self.path.write_bytes(original)  # whatever the last write was, the artifact is whole again


def probe_backend(backend: str, attempts: int, work: Path, tied: bool = False) -> dict:
    import torch

    import hfexport
    from hfexport import IntegrityError, ManifestError, UntrustedArtifactError

    refusals = (IntegrityError, ManifestError, UntrustedArtifactError)
    start = time.perf_counter()
    artifact, other = work / "artifact", work / "other"
    export_tiny_llama(backend, 0, artifact, tied)
    export_tiny_llama(backend, 1, other, tied)
    export_s = time.perf_counter() - start
    prompt = torch.tensor(PROMPT)
    expected = hfexport.load(artifact).generate(prompt, max_new_tokens=6)
    other_ids = hfexport.load(other).generate(prompt, max_new_tokens=6)
    assert not torch.equal(expected, other_ids), "the two seeds must generate different ids for the probe to see"

    def generate() -> str:
        return "ok" if torch.equal(hfexport.load(artifact).generate(prompt, max_new_tokens=6), expected) \
            else "silent"

    def verify() -> str:
        reports = hfexport.load(artifact).verify_stored()
        return "ok" if all(report.passed for report in reports.values()) else "flagged"

    manifest = json.loads((artifact / "export.json").read_text())
    names = sorted(manifest["files_sha256"]) + ["export.json"]
    counts: dict[str, int] = {"ok": 0, "refused": 0, "flagged": 0, "silent": 0, "other error": 0}
    errors: dict[str, str] = {}
    per_file: dict[str, int] = {}
    swaps = 0
    for name in names:
        path = artifact / name
        if not (other / name).is_file():
            continue
        original, replacement = path.read_bytes(), (other / name).read_bytes()
        for mode in ("replace", "in-place"):
            for operation in (generate, verify):
                writer = Writer(path, original, replacement, mode)
                writer.start()
                try:
                    for _ in range(attempts):
                        try:
                            outcome = operation()
                        except refusals:
                            outcome = "refused"
                        except hfexport.VerificationError:
                            outcome = "flagged"
                        except Exception as error:  # noqa: BLE001 - the probe names every other failure
                            outcome = "other error"
                            errors.setdefault(f"{type(error).__name__}", f"{name}, {mode}, "
                                              f"{operation.__name__}: {str(error)[:200]}")
                        counts[outcome] += 1
                finally:
                    writer.stop(original)
                swaps += writer.swaps
                per_file[name] = per_file.get(name, 0) + writer.swaps
    assert torch.equal(hfexport.load(artifact).generate(prompt, max_new_tokens=6), expected)
    return {"backend": backend, "files": names, "attempts": sum(counts.values()), "swaps": swaps,
            "swaps_per_file": per_file, "counts": counts, "errors": errors, "export_s": round(export_s, 1),
            "probe_s": round(time.perf_counter() - start - export_s, 1)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backend", nargs="+", choices=BACKENDS, help="default: every installed one")
    parser.add_argument("--attempts", type=int, default=5,
                        help="attempts per file, writer and operation (default 5: ~1,000+ swaps per backend)")
    parser.add_argument("--json", type=Path, help="also write the results as JSON")
    parser.add_argument("--tied", action="store_true",
                        help="tie the Llama's embedding and head (tie_word_embeddings): on executorch-xnnpack the "
                             "table read by a portable kernel and by XNNPACK is stored once, in model.ptd")
    parser.add_argument("--worker", choices=BACKENDS, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        with tempfile.TemporaryDirectory(prefix="hfexport-probe-") as work:
            print("RESULT " + json.dumps(probe_backend(args.worker, args.attempts, Path(work), args.tied)), flush=True)
        return 0

    import hfexport

    installed = {info.name for info in hfexport.list_backends()}
    backends = [b for b in (args.backend or BACKENDS) if b in installed]
    results, failed = [], False
    for backend in backends:
        print(f"{backend}: exporting two seeded tiny Llamas, then probing ...", flush=True)
        run = subprocess.run([sys.executable, __file__, "--worker", backend, "--attempts", str(args.attempts),
                              *(["--tied"] if args.tied else [])], capture_output=True, text=True)
        lines = [line for line in run.stdout.splitlines() if line.startswith("RESULT ")]
        if run.returncode != 0 or not lines:
            failed = True
            how = f"killed by signal {-run.returncode}" if run.returncode < 0 else f"exit {run.returncode}"
            print(f"  worker {how}:\n{run.stderr[-3000:]}")
            results.append({"backend": backend, "crash": how})
            continue
        result = json.loads(lines[-1][len("RESULT "):])
        results.append(result)
        c = result["counts"]
        print(f"  {len(result['files'])} files ({', '.join(result['files'])})\n"
              f"  {result['attempts']} attempts, {result['swaps']:,} writes: ok {c['ok']}, refused {c['refused']}, "
              f"flagged {c['flagged']}, silent {c['silent']}, other error {c['other error']} "
              f"(export {result['export_s']} s, probe {result['probe_s']} s; fewest writes on one file: "
              f"{min(result['swaps_per_file'].values()):,})")
        for kind, example in result["errors"].items():
            print(f"    {kind}: {example}")
        failed |= bool(c["silent"] or c["other error"])
    print("verdict: " + ("FAILED: a silent change, an unexpected error or a crash (above)" if failed else
                         "no silent change, no crash, every error an hfexport refusal"))
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
