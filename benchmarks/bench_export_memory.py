"""Peak resident memory of an export, phase by phase, against the weights it holds (issue 44).

One seeded Llama built from its config (no network, no checkpoint), exported with ``hfexport.export`` (default: the
``dynamo`` backend, task ``text-generation``), saved, then loaded and verified in a fresh process. For each phase it
prints the RSS at the phase's start, the phase's peak RSS, what the phase added over its start, and the ratios of the
peak and of the growth to the weight bytes (goal of issue 44: the export's peak <= 1.3x the weights, verification
included; the model held by the exporting process is one of those copies).

Phases (the export's, nested in ``export``): ``capture`` (the tracer's stages and ``torch.export.export``),
``package`` (the exporter's ``package``), ``verify`` (the artifact in memory against eager); then
``save_pretrained``; then, in a fresh process, ``load`` (``hfexport.load``: hashes checked, program read) and
``verify_stored`` (the loaded artifact re-runs the stored verification inputs). With ``--steps`` each toolchain step
of the export (``ExportContext.step``: ``torch.onnx.export``, ``onnxscript optimizer``, ``onnxruntime.InferenceSession``,
...) is a phase too (each phase starts with a ``gc.collect()``). ``verify=False`` (``--no-verify``) still runs the
verification once (it records, and does not raise): the peak without verification is the export's before its
``verify`` phase, printed last. ``--size 0.5b`` is bench_generation.py's seeded Qwen2-0.5B-shaped model (1,976 MB):
run it under ``flock /tmp/hfexport-big.lock`` on a shared machine.

The peak is the kernel's ``VmHWM`` (resident pages, anonymous and file-backed), reset at each phase's start
(``/proc/self/clear_refs``, 5): tracemalloc does not see tensor storage. Linux only.

Run: uv run python benchmarks/bench_export_memory.py [--size 400mb|0.5b] [--task text-generation|none] [--backend dynamo]
     [--steps] [--no-verify] [--no-load] [--tied] [--from-pretrained] [--max-cache-len 256]
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Iterator
from pathlib import Path

os.environ["HF_HUB_OFFLINE"] = "1"

# Llama shapes (untied embeddings): ~106 M parameters, 424 MB of fp32 weights; and a few MB for a smoke run
SIZES = {
    "400mb": {"hidden_size": 768, "num_hidden_layers": 8, "num_attention_heads": 12, "num_key_value_heads": 4,
              "intermediate_size": 2048, "vocab_size": 32000},
    "tiny": {"hidden_size": 16, "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 2,
             "intermediate_size": 32, "vocab_size": 64},
    "small": {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 4,
              "intermediate_size": 172, "vocab_size": 1000},
    # bench_generation.py's --size 0.5b: a seeded Qwen2ForCausalLM of Qwen2-0.5B's shapes (494 M parameters, tied
    # embeddings, 1,976 MB of fp32 weights); run it under `flock /tmp/hfexport-big.lock` on a shared machine
    "0.5b": {"hidden_size": 896, "num_hidden_layers": 24, "num_attention_heads": 14, "num_key_value_heads": 2,
             "intermediate_size": 4864, "vocab_size": 151936},
}
QWEN2 = ("0.5b",)  # sizes built as Qwen2ForCausalLM (tied embeddings, rope_theta 1e6), as bench_generation.py does
MIB = 2**20


def _status(field: str) -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field):
                return int(line.split()[1]) * 1024
    return 0


def _reset_peak() -> None:
    with open("/proc/self/clear_refs", "w") as f:  # 5: reset VmHWM to the current RSS (Linux >= 4.0)
        f.write("5")


class Phases:
    """Peak RSS per phase; a nested phase's peak is folded into the phases around it."""

    def __init__(self) -> None:
        self.rows: list[dict] = []
        self.open: list[dict] = []

    def _fold(self) -> None:
        hwm = _status("VmHWM:")
        for row in self.open:
            row["peak"] = max(row["peak"], hwm)

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        gc.collect()
        self._gap(f"(before {name})")
        self._fold()
        _reset_peak()
        row = {"phase": "  " * len(self.open) + name, "start": _status("VmRSS:"), "peak": 0}
        self.open.append(row)
        self.rows.append(row)
        start = time.perf_counter()
        try:
            yield
        finally:
            if self.rows[-1] is not row:  # the time after its last nested phase
                self._gap(f"(after {self.rows[-1]['phase'].strip()})")
            self._fold()
            self.open.pop()
            row["end"] = _status("VmRSS:")
            row["seconds"] = time.perf_counter() - start
            _reset_peak()

    def _gap(self, name: str) -> None:
        """A row for the time between two nested phases of an open one, where its peak rose 32 MiB or more above
        the RSS around it (work outside any named phase: it shows in the enclosing phase's peak only)."""
        if not self.open:
            return
        hwm, rss, last = _status("VmHWM:"), _status("VmRSS:"), self.rows[-1]
        before = last.get("end", last["start"])  # the previous phase's end, or the open one's start
        if hwm - max(rss, before) >= 32 * MIB:
            self.rows.append({"phase": "  " * len(self.open) + name, "start": before, "peak": hwm, "end": rss,
                              "seconds": 0.0})

    def wrap(self, owner: object, attribute: str, name: str) -> None:
        """Run ``owner.attribute`` (a method) inside phase ``name`` each time it is called."""
        original = getattr(owner, attribute)
        phases = self

        def wrapped(*args, **kwargs):
            with phases.phase(name):
                return original(*args, **kwargs)

        setattr(owner, attribute, wrapped)

    def wrap_steps(self, owner: object) -> None:
        """Each ``owner.step(name)`` (``ExportContext.step``: a toolchain call) also a phase named for the call."""
        original = owner.step  # type: ignore[attr-defined]
        phases = self

        @contextlib.contextmanager
        def step(self, name: str) -> Iterator[None]:
            with phases.phase(name[:40]), original(self, name):
                yield

        owner.step = step  # type: ignore[attr-defined]


def executorch_steps(phases: Phases) -> None:
    """ExecuTorch's own stages inside the steps ``to_edge_transform_and_lower`` and ``to_executorch``, as phases:
    to_edge (decompositions, edge dialect), the transform passes, to_backend (the partitioner, XNNPACK's
    preprocess: its weight packing), the passes and memory planning of to_executorch, emit_program, the
    serialization (flatbuffer and segments) and the writes of the .pte and the .ptd."""
    from executorch.exir.program import _program

    for name, label in (("_gen_edge_manager_for_partitioners", "et: to_edge (edge dialect)"),
                        ("emit_program", "et: emit_program"),
                        ("serialize_for_executorch", "et: serialize_for_executorch")):
        phases.wrap(_program, name, label)
    for owner, name, label in ((_program.EdgeProgramManager, "transform", "et: transform passes"),
                               (_program.EdgeProgramManager, "to_backend", "et: to_backend (XNNPACK preprocess)"),
                               (_program.ExecutorchProgramManager, "write_to_file", "et: write .pte"),
                               (_program.ExecutorchProgramManager, "write_tensor_data_to_file", "et: write .ptd")):
        phases.wrap(owner, name, label)


def seeded_llama(sizes: dict, seed: int = 0, tied: bool = False):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    if sizes is SIZES["0.5b"]:  # as bench_generation.py builds it
        config = Qwen2Config(**sizes, max_position_embeddings=32768, tie_word_embeddings=True, bos_token_id=1,
                             eos_token_id=2, pad_token_id=0, rope_theta=1e6)
        return Qwen2ForCausalLM(config).eval()
    config = LlamaConfig(**sizes, max_position_embeddings=2048, bos_token_id=1, eos_token_id=2, pad_token_id=0,
                         tie_word_embeddings=tied)
    return LlamaForCausalLM(config).eval()


def weight_bytes(model) -> int:
    seen, total = set(), 0
    for tensor in (*model.parameters(), *model.buffers()):
        if tensor.data_ptr() not in seen:
            seen.add(tensor.data_ptr())
            total += tensor.untyped_storage().nbytes()
    return total


def export_and_save(args: argparse.Namespace, out_dir: Path) -> tuple[int, list[dict]]:
    import importlib

    import torch

    import hfexport

    torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore")
    options = {} if args.task == "none" else {"task": args.task, "max_cache_len": args.max_cache_len}
    phases = Phases()
    with phases.phase("libraries"):  # torch, transformers, the backend: a model of a few KB exported and saved
        tiny = {**options, "max_cache_len": min(args.max_cache_len, 256)} if options else options
        hfexport.export(seeded_llama(SIZES["tiny"]), backend=args.backend, **tiny).save_pretrained(
            out_dir.with_name("tiny"), overwrite=True)
    if args.from_pretrained:  # what a user runs: the checkpoint (safetensors) saved first, then loaded
        seeded_llama(SIZES[args.size], tied=args.tied).save_pretrained(out_dir.with_name("checkpoint"))
        gc.collect()
        with phases.phase("from_pretrained"):
            from transformers import AutoModelForCausalLM

            model = AutoModelForCausalLM.from_pretrained(out_dir.with_name("checkpoint")).eval()
    else:
        with phases.phase("build model"):
            model = seeded_llama(SIZES[args.size], tied=args.tied)
    module, _, name = hfexport.get_backend(args.backend).exporter.partition(":")
    exporter_class = getattr(importlib.import_module(module), name)  # hooks on the classes the export runs
    phases.wrap(exporter_class.tracer, "capture", "capture")
    phases.wrap(exporter_class, "package", "package")
    phases.wrap(hfexport.ExportedModel, "verify_export", "verify")
    if args.steps:
        from hfexport.plugin import ExportContext

        phases.wrap_steps(ExportContext)
        if args.backend.startswith("executorch"):
            executorch_steps(phases)
    with phases.phase("export"):
        exported = hfexport.export(model, backend=args.backend, verify=not args.no_verify, **options)
    with phases.phase("save_pretrained"):
        exported.save_pretrained(out_dir, overwrite=True)
    return weight_bytes(model), phases.rows


def load_child(out_dir: str, backend: str) -> None:
    """In a fresh process: import the toolchain, then load and re-run the stored verification (JSON rows)."""
    import importlib

    import torch  # noqa: F401

    import hfexport

    importlib.import_module(hfexport.get_backend(backend).exporter.partition(":")[0])
    warnings.filterwarnings("ignore")
    phases = Phases()
    with phases.phase("libraries"):  # what a load imports, through a tiny artifact saved beside
        hfexport.load(Path(out_dir).with_name("tiny")).verify_stored()
    with phases.phase("load"):
        exported = hfexport.load(out_dir)
    with phases.phase("verify_stored"):
        reports = exported.verify_stored()
    assert all(report.passed for report in reports.values()), reports
    print("ROWS " + json.dumps(phases.rows))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", choices=list(SIZES), default="400mb")
    parser.add_argument("--backend", default="dynamo")
    parser.add_argument("--task", default="text-generation", help="a task, or 'none' (one forward pass)")
    parser.add_argument("--max-cache-len", type=int, default=256)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--tied", action="store_true", help="tied input and output embeddings (as Qwen2-0.5B)")
    parser.add_argument("--from-pretrained", action="store_true",
                        help="save the seeded model's checkpoint first, then load it with from_pretrained (a phase)")
    parser.add_argument("--steps", action="store_true",
                        help="each toolchain step of the export (ExportContext.step: torch.onnx.export, ...) a phase")
    parser.add_argument("--no-verify", action="store_true", help="export with verify=False")
    parser.add_argument("--no-load", action="store_true", help="skip the fresh process's load and verify_stored")
    parser.add_argument("--load-child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.load_child:
        load_child(args.load_child, args.backend)
        return

    import torch
    import transformers

    with tempfile.TemporaryDirectory() as tmp:
        out_dir = Path(tmp) / "artifact"
        weights, rows = export_and_save(args, out_dir)
        disk = sum(p.stat().st_size for p in out_dir.rglob("*") if p.is_file())
        child = None if args.no_load else subprocess.run([sys.executable, os.path.abspath(__file__), "--load-child", str(out_dir),
                                "--backend", args.backend],
                               capture_output=True, text=True)
        if child is not None and child.returncode:
            raise RuntimeError(f"the load process failed:\n{child.stdout[-3000:]}\n{child.stderr[-3000:]}")
        loaded = [] if child is None else json.loads(child.stdout[child.stdout.rindex("ROWS ") + 5:].splitlines()[0])

    print(f"# bench_export_memory: torch {torch.__version__}, transformers {transformers.__version__}; "
          f"{os.cpu_count()} CPUs, {args.threads} thread(s)")
    print(f"seeded LlamaForCausalLM {SIZES[args.size]}{', tied embeddings' if args.tied else ''}"
          f"{', loaded with from_pretrained from its safetensors' if args.from_pretrained else ''}; "
          f"backend {args.backend}, task {args.task}"
          + (f", max_cache_len {args.max_cache_len}" if args.task != "none" else "")
          + (", verify=False" if args.no_verify else ""))
    print(f"weights {weights / 1e6:,.0f} MB ({weights / MIB:,.0f} MiB); artifact {disk / 1e6:,.0f} MB on disk "
          f"({disk / weights:.2f}x)")
    print(f"\n{'phase':<44} | {'s':>6} | {'start MiB':>9} | {'peak MiB':>8} | {'added MiB':>9} | {'peak/wts':>8} | "
          f"{'added/wts':>9}")
    print("-" * 110)
    for process, table in (("export process", rows), ("load process (fresh)", loaded)):
        print(f"{process}:")
        for row in table:
            print(f"{row['phase']:<44} | {row['seconds']:>6.1f} | {row['start'] / MIB:>9,.0f} | "
                  f"{row['peak'] / MIB:>8,.0f} | {(row['peak'] - row['start']) / MIB:>9,.0f} | "
                  f"{row['peak'] / weights:>8.2f} | {(row['peak'] - row['start']) / weights:>9.2f}")
    libraries = rows[1]["start"]  # the export process's RSS before the model was built (torch, transformers)
    export_peak = max(row["peak"] for row in rows[2:])
    if not loaded:
        print("start: RSS at the phase's start; peak: VmHWM within it (nested phases included); added: peak - start")
        return
    load_peak, load_libraries = max(row["peak"] for row in loaded[1:]), loaded[1]["start"]
    print(f"\nexport process: peak of export + save {export_peak / MIB:,.0f} MiB = {export_peak / weights:.2f}x "
          f"weights; over the {libraries / MIB:,.0f} MiB of libraries it held before building the model: "
          f"{(export_peak - libraries) / MIB:,.0f} MiB = {(export_peak - libraries) / weights:.2f}x weights (the "
          "model itself is 1.00x)")
    verify = next((i for i, row in enumerate(rows) if row["phase"].strip() == "verify"), None)
    if verify is not None:  # hfexport.export(verify=False) runs the verification too (and does not raise)
        before = max(row["peak"] for row in rows[2:verify] if row["phase"] != "export")  # export's holds verify's
        print(f"export process before the verification (capture, lower, package): peak {before / MIB:,.0f} MiB = "
              f"{before / weights:.2f}x weights; over its libraries: {(before - libraries) / MIB:,.0f} MiB = "
              f"{(before - libraries) / weights:.2f}x weights")
    print(f"load process: peak {load_peak / MIB:,.0f} MiB = {load_peak / weights:.2f}x weights; over its "
          f"{load_libraries / MIB:,.0f} MiB of libraries: {(load_peak - load_libraries) / MIB:,.0f} MiB = "
          f"{(load_peak - load_libraries) / weights:.2f}x weights")
    print("start: RSS at the phase's start; peak: VmHWM within it (nested phases included); added: peak - start")


if __name__ == "__main__":
    main()
