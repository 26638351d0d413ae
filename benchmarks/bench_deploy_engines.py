"""Deployment engines on hfexport's own artifacts: decode tok/s of ONNX Runtime GenAI running the onnx text-generation
artifact as-is (``onnxruntime_genai.Model("<artifact>")``, its ``Generator``) and of ExecuTorch's LLM runner
running the executorch-xnnpack artifact as-is (``TextLLMRunner``, the wheel's Python bindings; ``--executorch``),
each beside hfexport's own greedy loop (``hfexport.load(dir).generate``) on the same files; and whether each engine's
ids equal eager greedy's.

One seeded Llama-family model (``--size toy``: hidden 512, 8 layers, vocab 32k, 58 M parameters; ``small``: a quick
check), exported once with ``max_cache_len`` = prompt + new tokens; batch 1, one thread (ORT GenAI's
``intra_op_num_threads`` through ``og.Config.overlay``, hfexport's session reopened with one), each
engine in its own new process, rounds interleaved, medians over ``--repeats`` rounds. Decode tok/s = decode steps /
the seconds from the first new token to the last (the prefill is left out).

The LLM runner reads a tokenizer: a BPE ``tokenizer.json`` with one character per id and no merges, so that the
prompt's text is its ids; its decode time is from the token callback's first new token to the last.

Run: HF_HUB_OFFLINE=1 uv run python benchmarks/bench_deploy_engines.py [--size toy|small] [--prompt 32] [--new 64]
     [--repeats 3] [--executorch] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

os.environ["HF_HUB_OFFLINE"] = "1"

SIZES = {
    "toy": {"hidden_size": 512, "num_hidden_layers": 8, "num_attention_heads": 8, "num_key_value_heads": 8,
            "intermediate_size": 1376, "vocab_size": 32000},
    "small": {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
              "intermediate_size": 172, "vocab_size": 1000},
}

OG = """
import json, sys, time
import onnxruntime_genai as og
config = og.Config(sys.argv[1])
config.overlay(sys.argv[4])  # one thread (the artifact's files stay as saved)
model = og.Model(config)
params = og.GeneratorParams(model)
params.set_search_options(do_sample=False)
generator = og.Generator(model, params)
generator.append_tokens(json.loads(sys.argv[2]))
ids, stamps = [], []
while not generator.is_done() and len(ids) < int(sys.argv[3]):
    generator.generate_next_token()
    ids.append(int(generator.get_next_tokens()[0]))
    stamps.append(time.perf_counter())
print(json.dumps({"ids": ids, "decode_s": stamps[-1] - stamps[0]}))
"""

BASE = 0x4E00  # token i <-> chr(BASE + i) in the LLM runner's tokenizer
ET_RUNNER = """
import json, sys, time
import executorch.extension.llm.custom_ops.custom_ops  # the LLM kernels
from executorch.extension.llm.runner import GenerationConfig, TextLLMRunner
runner = TextLLMRunner(sys.argv[1], sys.argv[1].rsplit("/", 2)[0] + "/tokenizer.json")
config = GenerationConfig()
config.max_new_tokens, config.temperature, config.echo = int(sys.argv[3]), 0.0, False
ids, stamps = [], []
def on_token(piece):
    ids.extend(ord(c) - BASE for c in piece)
    stamps.append(time.perf_counter())
runner.generate("".join(chr(BASE + i) for i in json.loads(sys.argv[2])), config, token_callback=on_token)
print(json.dumps({"ids": ids, "decode_s": stamps[-1] - stamps[0]}))
""".replace("BASE", str(BASE))

HFEXPORT = """
import json, sys, torch
import hfexport
import onnxruntime
exported = hfexport.load(sys.argv[1])
for component in exported.components.values():  # one intra-op thread, as ORT GenAI's session below
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads, options.inter_op_num_threads, options.log_severity_level = 1, 1, 3
    component.runner.session_options = options
    component.runner.open()
prompt = torch.tensor([json.loads(sys.argv[2])])
out = exported.generate(prompt, max_new_tokens=int(sys.argv[3]), eos_token_id=None)
stats = exported.generation_stats
print(json.dumps({"ids": out[0, prompt.shape[1]:].tolist(), "decode_s": sum(stats["decode_step_s"])}))
"""


def run(script: str, *args: str) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    proc = subprocess.run([sys.executable, "-c", script, *args], capture_output=True, text=True, env=env, timeout=900)
    if proc.returncode:
        raise RuntimeError(proc.stderr[-3000:])
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", choices=sorted(SIZES), default="toy")
    parser.add_argument("--prompt", type=int, default=32)
    parser.add_argument("--new", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--executorch", action="store_true", help="also the executorch-xnnpack artifact in "
                        "ExecuTorch's LLM runner, beside hfexport's loop on it")
    parser.add_argument("--json")
    args = parser.parse_args()

    import torch
    import transformers

    import hfexport

    torch.manual_seed(0)
    config = transformers.LlamaConfig(**SIZES[args.size], max_position_embeddings=4096, eos_token_id=2,
                                      bos_token_id=1)
    model = transformers.LlamaForCausalLM(config).eval()
    prompt = torch.randint(3, config.vocab_size, (1, args.prompt), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        eager = model.generate(prompt, do_sample=False, max_new_tokens=args.new, eos_token_id=None,
                               min_new_tokens=args.new)[0, args.prompt:].tolist()
    # every new token generated by every engine, as hfexport's eos_token_id=None: an eos id eager never produced here
    # (ORT GenAI and the LLM runner stop at the artifact's)
    unused = next(i for i in range(3, config.vocab_size) if i not in eager)
    model.generation_config.eos_token_id = model.config.eos_token_id = unused
    work = Path(tempfile.mkdtemp(prefix="bench-deploy-"))
    artifact = work / "onnx"
    exported = hfexport.export(model, backend="onnx", task="text-generation",
                               max_cache_len=args.prompt + args.new)
    exported.save_pretrained(artifact)
    overlay = json.dumps({"model": {"decoder": {"session_options": {"intra_op_num_threads": 1,
                                                                    "inter_op_num_threads": 1}}}})
    ids = json.dumps(prompt[0].tolist())
    engines = {"hfexport onnx (own loop)": (HFEXPORT, str(artifact)),
               "ORT GenAI on the artifact": (OG, str(artifact))}  # its root
    if args.executorch:
        from tokenizers import Tokenizer, models

        et_dir = work / "executorch"
        et = hfexport.export(model, backend="executorch-xnnpack", task="text-generation",
                             max_cache_len=args.prompt + args.new)
        et.save_pretrained(et_dir)
        vocab = {chr(BASE + i): i for i in range(config.vocab_size)}
        Tokenizer(models.BPE(vocab, merges=[])).save(str(et_dir / "tokenizer.json"))  # beside export.json
        engines["hfexport executorch (own loop)"] = (HFEXPORT.replace("import onnxruntime\n", "").split(
            "for component")[0] + HFEXPORT.split("component.runner.open()\n")[1], str(et_dir))
        engines["ExecuTorch LLM runner"] = (ET_RUNNER, str(et_dir / "decoder" / "model.pte"))
    rows = {name: [] for name in engines}
    for _ in range(args.repeats):
        for name, (script, where) in engines.items():
            rows[name].append(run(script, where, ids, str(args.new), overlay))
    print(f"# bench_deploy_engines: torch {torch.__version__}, onnxruntime-genai "
          f"{__import__('importlib.metadata').metadata.version('onnxruntime-genai')}, "
          f"{os.cpu_count()} CPUs ({platform.machine()}), 1 thread, load average {os.getloadavg()[0]:.2f}")
    print(f"seeded LlamaForCausalLM {args.size} ({sum(p.numel() for p in model.parameters()) / 1e6:.1f} M "
          f"parameters); prompt {args.prompt} + {args.new} new, batch 1; median of {args.repeats} rounds")
    print(f"{'engine':30} | decode tok/s | ids equal eager")
    result = {}
    for name, runs in rows.items():
        tok_s = statistics.median((len(r["ids"]) - 1) / r["decode_s"] for r in runs)
        equal = all(r["ids"] == eager for r in runs)
        result[name] = {"decode_tok_s": round(tok_s, 1), "ids_equal_eager": equal,
                        "runs_tok_s": [round((len(r["ids"]) - 1) / r["decode_s"], 1) for r in runs]}
        print(f"{name:30} | {tok_s:12.1f} | {'yes' if equal else 'no'}")
    if args.json:
        Path(args.json).write_text(json.dumps({"size": args.size, "prompt": args.prompt, "new": args.new,
                                               "results": result}, indent=2) + "\n")


if __name__ == "__main__":
    main()
