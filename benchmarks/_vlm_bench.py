"""``bench_generation.py --vlm``: a vision-language model exported with ``task="image-text-to-text"`` against eager
PyTorch, in one process, rounds interleaved: the ``vision`` program's ms per image (``run("vision", ...)``; eager:
``model.get_image_features``), ``generate``'s whole image encoding (``encode_s``: the prompt's embedding, the vision
program and the merge), and decode tokens/s at prompt 32 (16 image tokens + 16 text tokens) + 64 new, batch 1, one
thread, ``eos_token_id=None``; and whether the token ids equal eager's.

The model is a seeded SmolVLM-shaped one ("tiny but not toy"): a SigLIP-style tower of hidden 256, 6 layers, 256x256
images in 16x16 patches (256 patches), pixel-shuffled by 4 to 16 image tokens, and the toy Llama of
``bench_generation.py`` (hidden 512, 8 layers, vocab 32k).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

VISION = {"model_type": "smolvlm_vision", "hidden_size": 256, "intermediate_size": 1024, "num_hidden_layers": 6,
          "num_attention_heads": 4, "image_size": 256, "patch_size": 16}
TEXT = {"model_type": "llama", "hidden_size": 512, "num_hidden_layers": 8, "num_attention_heads": 8,
        "num_key_value_heads": 8, "intermediate_size": 1376, "vocab_size": 32000, "max_position_embeddings": 2048}
IMAGE_TOKEN, TEXT_TOKENS, NEW_TOKENS = 31999, 16, 64


def seeded_smolvlm(seed: int = 0) -> Any:
    import torch
    import transformers

    config = transformers.SmolVLMConfig(vision_config=VISION, text_config=TEXT, image_token_id=IMAGE_TOKEN,
                                        scale_factor=4)
    torch.manual_seed(seed)
    return transformers.SmolVLMForConditionalGeneration(config).eval()


def _inputs(image_tokens: int) -> tuple[Any, Any]:
    import torch

    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(3, IMAGE_TOKEN - 1, (1, TEXT_TOKENS + image_tokens), generator=generator)
    ids[0, 4:4 + image_tokens] = IMAGE_TOKEN
    pixel_values = torch.randn(1, 1, 3, VISION["image_size"], VISION["image_size"], generator=generator)
    return ids, pixel_values


class _StepClock:
    """A logits processor that changes nothing and stamps each step of eager ``generate``."""

    def __init__(self) -> None:
        self.stamps: list[float] = []

    def __call__(self, input_ids: Any, scores: Any) -> Any:
        self.stamps.append(time.perf_counter())
        return scores


def _eager(model: Any, ids: Any, pixel_values: Any) -> dict[str, Any]:
    import torch
    from transformers import LogitsProcessorList

    with torch.no_grad():
        start = time.perf_counter()
        model.model.get_image_features(pixel_values)
        vision_s = time.perf_counter() - start
        clock = _StepClock()
        out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), pixel_values=pixel_values,
                             do_sample=False, max_new_tokens=NEW_TOKENS, eos_token_id=None,
                             logits_processor=LogitsProcessorList([clock]))
    steps = len(clock.stamps) - 1
    return {"ids": out[0, ids.shape[1]:].tolist(), "vision_ms": vision_s * 1e3, "encode_ms": float("nan"),
            "tok_s": steps / (clock.stamps[-1] - clock.stamps[0])}


def _hfexport(exported: Any, ids: Any, pixel_values: Any) -> dict[str, Any]:
    start = time.perf_counter()
    exported.run("vision", pixel_values=pixel_values[0])
    vision_s = time.perf_counter() - start
    out = exported.generate(ids, pixel_values=pixel_values, max_new_tokens=NEW_TOKENS, eos_token_id=None)
    stats = exported.generation_stats
    return {"ids": out[0, ids.shape[1]:].tolist(), "vision_ms": vision_s * 1e3, "encode_ms": stats["encode_s"] * 1e3,
            "tok_s": stats["decode_tokens_per_s"]}


def main(backends: list[str], repeats: int, threads: int, max_cache_len: int,
         set_ort_threads: Callable[[Any, int], None]) -> dict[str, Any]:
    """Export ``seeded_smolvlm`` on each backend, then time every engine in interleaved rounds; prints the table
    and returns the results (``set_ort_threads``: bench_generation's, applied to ONNX Runtime sessions)."""
    import torch

    import hfexport

    torch.set_num_threads(threads)
    model = seeded_smolvlm()
    params = sum(p.numel() for p in model.parameters())
    engines: dict[str, Any] = {}
    export_s: dict[str, float] = {}
    for backend in backends:
        start = time.perf_counter()
        engines[backend] = hfexport.export(model, backend=backend, task="image-text-to-text",
                                           max_cache_len=max_cache_len)
        export_s[backend] = time.perf_counter() - start
        if backend == "onnx":
            set_ort_threads(engines[backend], threads)
    image_tokens = engines[backends[0]].manifest["generation"]["vision"]["tokens_per_image"] if backends else 16
    ids, pixel_values = _inputs(image_tokens)
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in ("eager", *backends)}
    for round_ in range(repeats + 1):  # the first round warms up
        for name in runs:
            result = _eager(model, ids, pixel_values) if name == "eager" else _hfexport(engines[name], ids,
                                                                                        pixel_values)
            if round_:
                runs[name].append(result)
    reference = runs["eager"][0]["ids"]
    print(f"SmolVLM-shaped seeded model, {params / 1e6:.1f} M parameters ({image_tokens} image tokens per "
          f"{VISION['image_size']}x{VISION['image_size']} image), prompt {ids.shape[1]} + {NEW_TOKENS} new, batch 1, "
          f"{threads} thread(s), median of {repeats} rounds")
    print(f"{'engine':<22}{'export s':>10}{'vision ms':>11}{'encode ms':>11}{'decode tok/s':>14}{'vs eager':>10}  ids")
    table = {}
    eager_tok_s = statistics.median(r["tok_s"] for r in runs["eager"])
    for name, results in runs.items():
        row = {key: statistics.median(r[key] for r in results) for key in ("vision_ms", "encode_ms", "tok_s")}
        row["exact"] = all(r["ids"] == reference for r in results)
        row["export_s"] = export_s.get(name)
        table[name] = row
        export = f"{row['export_s']:.1f}" if row["export_s"] is not None else "-"
        print(f"{name:<22}{export:>10}{row['vision_ms']:>11.2f}{row['encode_ms']:>11.2f}{row['tok_s']:>14.1f}"
              f"{row['tok_s'] / eager_tok_s:>9.2f}x  {'= eager' if row['exact'] else 'DIFFER'}")
    return {"params": params, "image_tokens": image_tokens, "prompt": ids.shape[1], "new_tokens": NEW_TOKENS,
            "threads": threads, "repeats": repeats, "engines": table}
