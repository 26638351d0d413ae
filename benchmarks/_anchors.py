"""Anchors for the generation benchmark: the engines users would pick instead of hfexport, measured on the same
model directory (``save_pretrained``) and the same token ids, greedy, batch 1, one thread.

Engines and variants (``ENGINES``):
  * ``ort-genai`` (ONNX Runtime GenAI, PyPI ``onnxruntime-genai``), converted by its model builder
    (``python -m onnxruntime_genai.models.builder -i HF_DIR -o OUT -p fp32|int4 -e cpu``; int4 is MatMulNBits,
    ``block_size=32``, ``accuracy_level=4``, passed explicitly as ``--extra_options``), generated with
    ``og.Generator`` (``append_tokens`` then ``generate_next_token``), ``intra_op_num_threads`` /
    ``inter_op_num_threads`` written into ``genai_config.json``'s ``model.decoder.session_options``;
  * ``ctranslate2`` (PyPI ``ctranslate2``), converted by ``TransformersConverter(hf_dir).convert(out,
    quantization=None|"int8")``, generated with ``Generator(out, device="cpu", intra_threads=1,
    inter_threads=1).generate_batch(..., include_prompt_in_result=False, callback=...)``;
  * ``openvino-genai`` (PyPI ``openvino-genai``), ``LLMPipeline(dir, "CPU", ATTENTION_BACKEND="SDPA",
    INFERENCE_PRECISION_HINT="f32", KV_CACHE_PRECISION="f32", INFERENCE_NUM_THREADS=threads)`` on token ids
    (``TokenizedInputs``), each token stamped by a ``StreamerBase``; variant ``hfexport``: hfexport's own IR
    (``hfexport.export(..., backend="openvino", task="text-generation")``, its ``decoder`` folder), variant
    ``optimum-fp32``: optimum-intel's (``optimum-cli export openvino --task text-generation-with-past
    --weight-format fp32``), ``optimum-int4``: the same with ``--weight-format int4 --group-size 128 --ratio 1.0
    --group-size-fallback adjust`` (NNCF INT4_ASYM, as hfexport's ``openvino:int4-weights``), run with the Python of ``$OPTIMUM_INTEL_PYTHON`` (a separate environment: optimum-intel
    2.2 pins transformers < 5.6), which must have optimum-intel installed;
  * ``optimum-executorch`` (PyPI ``optimum-executorch``), variant ``fp32``: converted by ``optimum-cli export executorch
    --task text-generation --recipe xnnpack --use_custom_sdpa --use_custom_kv_cache`` (its documented recipe for
    decoder LLMs on CPU: ExecuTorch's ``llama::custom_sdpa`` and ``llama::update_cache``, dynamic prompt length,
    ``max_seq_len`` the model's positions), run with the Python of ``$OPTIMUM_EXECUTORCH_PYTHON`` (a separate
    environment: optimum-executorch 1.1 pins transformers 5.0.0rc1); the ``model.pte`` it writes is run by this
    environment's ExecuTorch runtime (``executorch.runtime``, the same executorch 1.5.1 as hfexport's, with ExecuTorch's
    LLM kernels imported) as ``ExecuTorchModelForCausalLM.generate`` runs it: the whole prompt in one ``forward``
    (``input_ids [1, n]``, ``cache_position [n]``), then one ``forward`` per token with its position, greedy argmax of
    the last logits. The process's ExecuTorch threadpool is the caller's to size
    (``portable_lib._unsafe_reset_threadpool(threads)`` before any program loads, as ``bench_generation`` does);
    variant ``8da4w``: the same with ``--qlinear 8da4w --qlinear_group_size 32`` (torchao's
    ``Int8DynamicActivationIntxWeightConfig``: int4 weights, symmetric, groups of 32, its ``hqq_scale_only`` scales;
    int8 activations per token; embeddings float), as hfexport's ``executorch-xnnpack:8da4w``;

API per engine: ``convert(engine, hf_dir, out_dir, variant) -> dict`` (runs the converter in a subprocess: wall
seconds, that process's peak RSS, bytes on disk), ``load(engine, out_dir, threads=1)`` and
``decode_timings(loaded, prompt_ids, new_tokens) -> dict`` (generated ids, decode tok/s = steps after the first new
token / time from the first new token to the last, ms per token near positions 64 and 1000 when the run covers
them). Every run generates exactly ``new_tokens`` tokens: the end token is masked until then (ORT GenAI
``min_length``, CTranslate2 ``min_length``), the closest either engine has to ``eos_token_id=None``; only a step
where the model's argmax *is* the end token can differ from eager's ``generate(eos_token_id=None)``.

Neither converter runs without a tokenizer (both call ``AutoTokenizer.from_pretrained(hf_dir)``); for a directory
that has none (the benchmark's seeded Llama), the conversion subprocess hands them a word-level tokenizer whose
token ``i`` is the string ``<id{i}>`` (built in memory; nothing is written to ``hf_dir``). Generation works on
token ids either way: ORT GenAI takes ids; CTranslate2 takes token strings, mapped through the converted model's
own vocabulary (``vocabulary.json``).

Standalone check (one round, 1 thread):
    HF_HUB_OFFLINE=1 uv run --group bench python benchmarks/_anchors.py [--small] [--engines ...]
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ENGINES = {"ort-genai": ("fp32", "int4"), "ctranslate2": ("float32", "int8"),
           "openvino-genai": ("hfexport", "optimum-fp32", "optimum-int4"), "optimum-executorch": ("fp32", "8da4w")}
INT4_BLOCK_SIZE = 32
INT4_ACCURACY_LEVEL = 4
PROBE_POSITIONS = (64, 1000)  # ms per token is reported near these cache positions when a run covers them
PROBE_WINDOW = 16  # decode steps either side of a probe position whose median is reported


# ── conversion (in a subprocess) ─────────────────────────────────────────────────────────────────────────────


def _id_tokenizer(hf_dir: str):
    """A word-level tokenizer over the model's vocabulary size whose token ``i`` is ``<id{i}>``, with the config's
    bos / eos / pad ids as its special tokens: what the converters read from a tokenizer (the vocabulary and the
    special tokens), for a model directory saved without one."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from transformers import AutoConfig, PreTrainedTokenizerFast

    config = AutoConfig.from_pretrained(hf_dir)
    vocab = {f"<id{i}>": i for i in range(config.vocab_size)}

    def name(token_id, default):
        return f"<id{token_id}>" if isinstance(token_id, int) else default

    unk = name(getattr(config, "pad_token_id", None), "<id0>")
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(WordLevel(vocab, unk_token=unk)),
                                        bos_token=name(config.bos_token_id, None),
                                        eos_token=name(config.eos_token_id, None), unk_token=unk, pad_token=unk)
    return tokenizer


def _install_tokenizer_fallback() -> None:
    """``AutoTokenizer.from_pretrained(d)`` for a local directory without tokenizer files returns
    ``_id_tokenizer(d)`` (both converters hold a reference to the same class, so patching it reaches them)."""
    from transformers import AutoTokenizer

    original = AutoTokenizer.from_pretrained.__func__

    def from_pretrained(cls, name, *args, **kwargs):
        files = ("tokenizer.json", "tokenizer.model", "tokenizer_config.json", "vocab.json", "spiece.model")
        if os.path.isdir(str(name)) and not any(os.path.exists(os.path.join(str(name), f)) for f in files):
            return _id_tokenizer(str(name))
        return original(cls, name, *args, **kwargs)

    AutoTokenizer.from_pretrained = classmethod(from_pretrained)


def _convert_child(engine: str, variant: str, hf_dir: str, out_dir: str) -> None:
    """The conversion itself (run by ``convert`` in a fresh interpreter)."""
    _install_tokenizer_fallback()
    if engine == "ort-genai":
        import runpy

        argv = ["builder", "-i", hf_dir, "-o", out_dir, "-p", variant, "-e", "cpu",
                "-c", os.path.join(out_dir, ".cache"), "--extra_options", "hf_token=false"]
        if variant == "int4":
            argv += [f"block_size={INT4_BLOCK_SIZE}", f"accuracy_level={INT4_ACCURACY_LEVEL}"]
        sys.argv = argv
        runpy.run_module("onnxruntime_genai.models.builder", run_name="__main__", alter_sys=True)
    elif engine == "ctranslate2":
        import ctranslate2

        quantization = None if variant == "float32" else variant
        ctranslate2.converters.TransformersConverter(hf_dir).convert(out_dir, quantization=quantization, force=True)
    elif engine == "openvino-genai" and variant == "hfexport":
        from transformers import AutoModelForCausalLM

        import hfexport

        model = AutoModelForCausalLM.from_pretrained(hf_dir).eval()
        hfexport.export(model, backend="openvino", task="text-generation").save_pretrained(out_dir, overwrite=True)
    elif engine == "openvino-genai":
        python = os.environ.get("OPTIMUM_INTEL_PYTHON")
        if not python:
            raise RuntimeError("set OPTIMUM_INTEL_PYTHON to the python of an environment with optimum-intel "
                               "(pip install 'optimum-intel[openvino]'; it pins transformers < 5.6)")
        weight_format = variant.removeprefix("optimum-")  # int4: hfexport's int4-weights settings (ASYM, 128, 1.0)
        # --group-size-fallback adjust: NNCF's group_size_fallback_mode=ADJUST, as hfexport's int4-weights (a MatMul
        # whose input width 128 does not divide, the toy's 1,376-wide down_proj, gets the largest group that does)
        extra = ["--group-size", "128", "--ratio", "1.0", "--group-size-fallback", "adjust"] \
            if weight_format == "int4" else []
        subprocess.run([python, "-m", "optimum.commands.optimum_cli", "export", "openvino", "-m", hf_dir, "--task",
                        "text-generation-with-past", "--weight-format", weight_format, *extra, out_dir], check=True)
    elif engine == "optimum-executorch":
        python = os.environ.get("OPTIMUM_EXECUTORCH_PYTHON")
        if not python:
            raise RuntimeError("set OPTIMUM_EXECUTORCH_PYTHON to the python of an environment with optimum-executorch "
                               "(pip install optimum-executorch; it pins transformers 5.0.0rc1)")
        # 8da4w: its --qlinear 8da4w (torchao Int8DynamicActivationIntxWeightConfig, int4 weights in groups of
        # --qlinear_group_size 32, passed explicitly: hfexport's executorch-xnnpack:8da4w default; embeddings float)
        extra = ["--qlinear", "8da4w", "--qlinear_group_size", "32"] if variant == "8da4w" else []
        subprocess.run([python, "-m", "optimum.commands.optimum_cli", "export", "executorch", "--model", hf_dir,
                        "--task", "text-generation", "--recipe", "xnnpack", "--use_custom_sdpa",
                        "--use_custom_kv_cache", *extra, "--output_dir", out_dir], check=True)
    else:
        raise ValueError(f"unknown engine {engine!r}")
    import resource

    with open("/proc/self/status") as status:  # VmHWM, not ru_maxrss: see bench_generation.own_peak_rss
        hwm = next((int(line.split()[1]) * 1024 for line in status if line.startswith("VmHWM:")), 0)
    print(f"PEAK {max(hwm, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024)}", flush=True)


# what the builder copies from the tokenizer (for the seeded model, the synthetic one): not counted as the model
_TOKENIZER_FILES = {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model"}


def _dir_bytes(path: str) -> int:
    return sum(p.stat().st_size for p in Path(path).rglob("*")
               if p.is_file() and ".cache" not in p.parts and p.name not in _TOKENIZER_FILES)


def convert(engine: str, hf_dir: str, out_dir: str, variant: str) -> dict:
    """Convert ``hf_dir`` with ``engine``'s own converter in a fresh Python process (imports included in the
    time, as a user's command pays them). Returns ``wall_s``, ``peak_rss_bytes`` (that process's own peak, its
    ``VmHWM``, and its children's: ``wait4``'s ``ru_maxrss`` would include the RSS this process had at the fork), ``disk_bytes`` of ``out_dir`` (the model: tokenizer files the
    builder copies are not counted; CTranslate2's vocabulary is) and the converter's output tail."""
    if variant not in ENGINES[engine]:
        raise ValueError(f"{engine} variants: {ENGINES[engine]}")
    os.makedirs(out_dir, exist_ok=True)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    command = [sys.executable, os.path.abspath(__file__), "--convert-child", engine, variant, hf_dir, out_dir]
    log = tempfile.TemporaryFile()
    start = time.perf_counter()
    process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)
    _, status, usage = os.wait4(process.pid, 0)
    wall = time.perf_counter() - start
    process.returncode = os.waitstatus_to_exitcode(status)
    log.seek(0)
    tail = log.read().decode(errors="replace")[-3000:]
    if process.returncode != 0:
        raise RuntimeError(f"{engine} {variant} conversion failed (exit {process.returncode}):\n{tail}")
    cache = Path(out_dir, ".cache")  # the builder's temporary files
    if cache.exists():
        import shutil

        shutil.rmtree(cache)
    peak = int(tail[tail.rindex("PEAK ") + 5:].split()[0]) if "PEAK " in tail else usage.ru_maxrss * 1024
    return {"engine": engine, "variant": variant, "wall_s": wall, "peak_rss_bytes": peak,
            "disk_bytes": _dir_bytes(out_dir), "log_tail": tail}


# ── loading ────────────────────────────────────────────────────────────────────────────────────────────────


class Loaded:
    def __init__(self, engine: str, out_dir: str, handle, vocab: list[str] | None = None):
        self.engine, self.out_dir, self.handle, self.vocab = engine, out_dir, handle, vocab
        self.index = {token: i for i, token in enumerate(vocab)} if vocab is not None else None


def load(engine: str, out_dir: str, threads: int = 1) -> Loaded:
    """Open a converted model on the CPU with ``threads`` intra-op threads and one inter-op thread."""
    if engine == "openvino-genai":
        import openvino_genai

        directory = Path(out_dir, "decoder") if Path(out_dir, "decoder", "openvino_model.xml").exists() else out_dir
        return Loaded(engine, out_dir, openvino_genai.LLMPipeline(
            str(directory), "CPU", ATTENTION_BACKEND="SDPA", INFERENCE_PRECISION_HINT="f32", KV_CACHE_PRECISION="f32",
            INFERENCE_NUM_THREADS=threads))
    if engine == "ort-genai":
        import onnxruntime_genai as og

        path = Path(out_dir, "genai_config.json")
        config = json.loads(path.read_text())
        options = config["model"]["decoder"].setdefault("session_options", {})
        options.update({"intra_op_num_threads": threads, "inter_op_num_threads": 1, "log_severity_level": 3})
        path.write_text(json.dumps(config, indent=4))
        return Loaded(engine, out_dir, og.Model(og.Config(out_dir)))
    if engine == "ctranslate2":
        import ctranslate2

        generator = ctranslate2.Generator(out_dir, device="cpu", intra_threads=threads, inter_threads=1)
        vocab_file = Path(out_dir, "vocabulary.json")
        vocab = json.loads(vocab_file.read_text()) if vocab_file.exists() else \
            Path(out_dir, "vocabulary.txt").read_text().splitlines()
        return Loaded(engine, out_dir, generator, vocab)
    if engine == "optimum-executorch":
        import executorch.extension.llm.custom_ops.custom_ops  # noqa: F401 - llama::custom_sdpa, update_cache kernels
        from executorch.runtime import Runtime

        program = Runtime.get().load_program(str(Path(out_dir, "model.pte")))
        return Loaded(engine, out_dir, program.load_method("forward"))
    raise ValueError(f"unknown engine {engine!r}")


# ── generation ─────────────────────────────────────────────────────────────────────────────────────────────


def _ort_generate(loaded: Loaded, prompt_ids: list[int], new_tokens: int) -> tuple[list[int], list[float]]:
    import numpy as np
    import onnxruntime_genai as og

    total = len(prompt_ids) + new_tokens
    params = og.GeneratorParams(loaded.handle)
    params.set_search_options(do_sample=False, max_length=total, min_length=total, batch_size=1)
    generator = og.Generator(loaded.handle, params)
    generator.append_tokens(np.asarray([prompt_ids], dtype=np.int32))  # the prefill (prompt logits)
    ids, stamps = [], []
    while not generator.is_done():
        generator.generate_next_token()  # picks from the current logits; from the 2nd call, a decode step first
        stamps.append(time.perf_counter())
        ids.append(int(generator.get_next_tokens()[0]))
    return ids, stamps


def _ct2_generate(loaded: Loaded, prompt_ids: list[int], new_tokens: int) -> tuple[list[int], list[float]]:
    stamps, ids = [], []

    def step(result) -> bool:
        stamps.append(time.perf_counter())
        ids.append(int(result.token_id))
        return False

    tokens = [loaded.vocab[i] for i in prompt_ids]
    # include_prompt_in_result=False forwards the prompt at once (the prefill); max_length then counts new tokens
    loaded.handle.generate_batch([tokens], max_length=new_tokens, min_length=new_tokens, beam_size=1,
                                 sampling_topk=1, include_prompt_in_result=False, callback=step)
    return ids, stamps


def _openvino_genai_generate(loaded: Loaded, prompt_ids: list[int], new_tokens: int
                             ) -> tuple[list[int], list[float]]:
    import numpy as np
    import openvino
    import openvino_genai

    stamps, ids = [], []

    class Stamps(openvino_genai.StreamerBase):
        def write(self, token):
            stamps.append(time.perf_counter())
            ids.extend(token if isinstance(token, list) else [token])
            return openvino_genai.StreamingStatus.RUNNING

        def end(self):
            pass

    config = loaded.handle.get_generation_config()
    config.max_new_tokens = config.min_new_tokens = new_tokens
    config.do_sample, config.ignore_eos = False, True
    prompt = np.asarray([prompt_ids], dtype=np.int64)
    loaded.handle.generate(openvino_genai.TokenizedInputs(openvino.Tensor(prompt), openvino.Tensor(np.ones_like(prompt))),
                           config, Stamps())
    return ids, stamps


def _optimum_executorch_generate(loaded: Loaded, prompt_ids: list[int], new_tokens: int
                                 ) -> tuple[list[int], list[float]]:
    """``ExecuTorchModelForCausalLM.generate``'s loop (optimum-executorch 1.1) on the loaded ``forward``: the prompt
    in one call, then one call per token at its cache position; the cache is the program's own buffers, overwritten
    from position 0 by the next prompt."""
    import torch

    method = loaded.handle
    logits = method.execute([torch.tensor([prompt_ids], dtype=torch.long),
                             torch.arange(len(prompt_ids), dtype=torch.long)])[0]
    token = int(torch.argmax(logits, dim=-1)[0, -1])
    ids, stamps = [token], [time.perf_counter()]
    position = len(prompt_ids)
    while len(ids) < new_tokens:
        logits = method.execute([torch.tensor([[token]], dtype=torch.long),
                                 torch.tensor([position], dtype=torch.long)])[0]
        token = int(torch.argmax(logits, dim=-1)[0, -1])
        stamps.append(time.perf_counter())
        ids.append(token)
        position += 1
    return ids, stamps


def decode_timings(loaded: Loaded, prompt_ids: list[int], new_tokens: int) -> dict:
    """Greedy generation of ``new_tokens`` after ``prompt_ids`` (batch 1), each token's time stamped as the engine
    hands it over. ``decode_tok_s``: (new_tokens - 1) decode steps / time from the first new token to the last;
    ``ms_per_token_at``: {position: median ms of the decode steps within ``PROBE_WINDOW`` of that cache position}
    for each of ``PROBE_POSITIONS`` the run covers."""
    run = {"ort-genai": _ort_generate, "openvino-genai": _openvino_genai_generate,
           "optimum-executorch": _optimum_executorch_generate}.get(loaded.engine, _ct2_generate)
    start = time.perf_counter()
    ids, stamps = run(loaded, list(map(int, prompt_ids)), new_tokens)
    steps = len(stamps) - 1
    decode_s = stamps[-1] - stamps[0]
    # the step from stamp k-1 to stamp k forwards new token k-1, at cache position len(prompt) + k - 1
    deltas = {len(prompt_ids) + k - 1: (stamps[k] - stamps[k - 1]) * 1e3 for k in range(1, len(stamps))}
    at = {}
    for position in PROBE_POSITIONS:
        window = [d for p, d in deltas.items() if abs(p - position) <= PROBE_WINDOW]
        if len(window) >= PROBE_WINDOW:  # the run covers the position (at least half the window)
            at[position] = statistics.median(window)
    return {"ids": ids, "new_tokens": len(ids), "first_token_s": stamps[0] - start, "decode_steps": steps,
            "step_s": [b - a for a, b in zip(stamps, stamps[1:], strict=False)],
            "decode_s": decode_s, "decode_tok_s": steps / decode_s if decode_s > 0 else float("nan"),
            "ms_per_token_at": at}


# ── standalone check ────────────────────────────────────────────────────────────────────────────────────────


def _eager(model, prompt_ids: list[int], new_tokens: int) -> list[int]:
    import torch

    ids = torch.tensor([prompt_ids])
    with torch.no_grad():
        out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=False,
                             max_new_tokens=new_tokens, eos_token_id=None)
    return out[0, len(prompt_ids):].tolist()


def main() -> None:
    import argparse
    import warnings

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--engines", nargs="+", default=list(ENGINES), choices=list(ENGINES))
    parser.add_argument("--small", action="store_true", help="the benchmark's SMALL Llama, short runs")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", metavar="PATH")
    args = parser.parse_args()

    os.environ["HF_HUB_OFFLINE"] = "1"
    warnings.filterwarnings("ignore")
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import torch
    from bench_generation import FULL, SMALL, seeded_llama

    torch.set_num_threads(args.threads)
    if "optimum-executorch" in args.engines:
        from executorch.extension.pybindings import portable_lib

        portable_lib._unsafe_reset_threadpool(args.threads)  # before any program loads: resetting later crashes
    sizes = SMALL if args.small else FULL
    runs = [(32, 64), (64, 64)] if args.small else [(32, 64), (512, 512)]
    versions = {}
    for name in ("onnxruntime_genai", "onnxruntime", "ctranslate2", "torch", "transformers"):
        try:
            versions[name] = __import__(name).__version__
        except Exception:
            pass
    print(f"# _anchors: {', '.join(f'{k} {v}' for k, v in versions.items())}; {os.cpu_count()} CPUs, "
          f"{args.threads} thread(s)")
    model = seeded_llama(sizes)
    prompts = {}
    generator = torch.Generator().manual_seed(1)
    for prompt, _ in runs:
        prompts[prompt] = torch.randint(3, sizes["vocab_size"], (prompt,), generator=generator).tolist()
    reference = {}
    for prompt, new in runs:
        start = time.perf_counter()
        reference[(prompt, new)] = _eager(model, prompts[prompt], new)
        print(f"eager generate, prompt {prompt} + {new} new: {time.perf_counter() - start:.1f} s (reference ids)")

    rows = []
    with tempfile.TemporaryDirectory(prefix="anchors-") as tmp:
        hf_dir = os.path.join(tmp, "hf")
        model.save_pretrained(hf_dir)
        for engine in args.engines:
            for variant in ENGINES[engine]:
                out_dir = os.path.join(tmp, f"{engine}-{variant}")
                row = {"engine": engine, "variant": variant}
                rows.append(row)
                try:
                    converted = convert(engine, hf_dir, out_dir, variant)
                except Exception as error:
                    row["error"] = str(error)[-1500:]
                    print(f"{engine} {variant}: {row['error']}")
                    continue
                row.update({k: converted[k] for k in ("wall_s", "peak_rss_bytes", "disk_bytes")})
                loaded = load(engine, out_dir, args.threads)
                decode_timings(loaded, prompts[runs[0][0]][:8], 4)  # warm-up (first-call allocations)
                for prompt, new in runs:
                    timing = decode_timings(loaded, prompts[prompt], new)
                    ref = reference[(prompt, new)]
                    equal = timing["ids"] == ref
                    first = next((i for i, (a, b) in enumerate(zip(timing["ids"], ref, strict=False)) if a != b),
                                 None)
                    row[f"{prompt}+{new}"] = {k: v for k, v in timing.items() if k != "ids"} | {
                        "ids_equal": equal, "first_diff": first}
                del loaded
                print(f"{engine} {variant}: converted in {row['wall_s']:.1f} s, "
                      f"{row['peak_rss_bytes'] / 2**20:.0f} MB peak RSS, {row['disk_bytes'] / 2**20:.1f} MB on disk; "
                      + "; ".join(f"{k}: {v['decode_tok_s']:.1f} tok/s, ids equal {v['ids_equal']}"
                                  for k, v in row.items() if "+" in k), flush=True)

    def ms_at(row, position):
        for key, value in row.items():
            if "+" in key and position in value.get("ms_per_token_at", {}):
                return f"{value['ms_per_token_at'][position]:.2f}"
        return "-"

    long_key = f"{runs[1][0]}+{runs[1][1]}"
    short_key = f"{runs[0][0]}+{runs[0][1]}"
    print(f"\n{'engine':<12} {'variant':<8} | {'conv s':>6} | {'peak MB':>7} | {'disk MB':>7} | "
          f"{short_key + ' tok/s':>13} | {long_key + ' tok/s':>14} | {'ms@64':>6} | {'ms@1000':>7} | ids equal eager")
    for row in rows:
        if "error" in row:
            print(f"{row['engine']:<12} {row['variant']:<8} | failed: {row['error'].splitlines()[-1][:80]}")
            continue
        equal = ", ".join(f"{k} {'yes' if v['ids_equal'] else 'no (first diff ' + str(v['first_diff']) + ')'}"
                          for k, v in row.items() if "+" in k)
        print(f"{row['engine']:<12} {row['variant']:<8} | {row['wall_s']:>6.1f} | {row['peak_rss_bytes'] / 2**20:>7.0f} | "
              f"{row['disk_bytes'] / 2**20:>7.1f} | {row[short_key]['decode_tok_s']:>13.1f} | "
              f"{row[long_key]['decode_tok_s']:>14.1f} | {ms_at(row, 64):>6} | {ms_at(row, 1000):>7} | {equal}")
    print("decode tok/s: (new - 1) decode steps / time from the first new token to the last; ms@N: median ms "
          f"per decode step within {PROBE_WINDOW} positions of cache position N; conversion in a fresh process "
          "(imports included), peak RSS of that process")
    if args.json:
        Path(args.json).write_text(json.dumps({"model": sizes, "versions": versions, "threads": args.threads,
                                               "rows": rows}, indent=2, default=str))


if __name__ == "__main__":
    if len(sys.argv) == 6 and sys.argv[1] == "--convert-child":
        _convert_child(*sys.argv[2:])
    else:
        main()
