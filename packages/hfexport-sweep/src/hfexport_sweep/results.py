"""The results directory of a sweep: its files, statuses and records, read by the sweep and by its reports.

A results directory (``reports/<backend>/``) holds ``meta.json`` (the backend, the runner and the versions
that decide the results, plus the history of runs), ``results.jsonl`` (one record per case, appended as cases
finish), and the reports written from them. Importing this module is light (no torch).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

__all__ = [
    "ALT_BATCH",
    "ALT_LARGE_BATCH",
    "ALT_SEQ_LEN",
    "BATCH",
    "COMMON_ARCHITECTURES",
    "LARGE_BATCH",
    "META_FILE",
    "META_KIND",
    "META_SCHEMA",
    "RESULTS_FILE",
    "SEQ_LEN",
    "STATUSES",
    "TRACED_STATUSES",
    "default_zoo_shapes",
    "load_results",
]

BATCH, ALT_BATCH = 2, 3
"""The default zoo's batch at the traced and at the checked (alt) shape, for most cases."""
LARGE_BATCH, ALT_LARGE_BATCH = 9, 10
"""Batches of the one case per model type that :func:`hfexport_sweep.zoo.case_shapes` gives a batch above 8
(ExecuTorch's default ``max_batch``): the case ``sample_cases(0)`` draws for its family, so that ``--sample --seed 0``
covers it."""
SEQ_LEN, ALT_SEQ_LEN = 8, 12
"""The default zoo's text tokens at the traced and at the checked shape."""


def default_zoo_shapes(zoo_inputs: int | None = None) -> str:
    """What the default zoo traces and checks, in words, from the constants :mod:`hfexport_sweep.zoo` builds its
    inputs with: ``"batch 9, then 10 for the one case per model type that --sample --seed 0 draws (batch 2, then 3 for
    the others), 8 tokens, then 12"``. ``zoo_inputs`` (a ``meta.json``'s): 1 gives version 1's batch 2, then 3."""
    tokens = f"{SEQ_LEN} tokens, then {ALT_SEQ_LEN}"
    if zoo_inputs == 1:
        return f"batch 2, then 3, {tokens}"
    return (f"batch {LARGE_BATCH}, then {ALT_LARGE_BATCH} for the one case per model type that `--sample --seed 0` "
            f"draws (batch {BATCH}, then {ALT_BATCH} for the others), {tokens}")

STATUSES = ("ok", "not_instantiable", "export_error", "runtime_error", "mismatch", "timeout", "skipped")
"""Every status a case can end in, best first."""
TRACED_STATUSES = ("ok", "mismatch", "runtime_error")
"""Statuses of a case whose export produced a program: a multimodal case with images (or audio) in these has its
vision (audio) tower traced (``vision_traced`` in its record)."""

RESULTS_FILE, META_FILE = "results.jsonl", "meta.json"
META_KIND = "hfexport-sweep"
META_SCHEMA = 1

COMMON_ARCHITECTURES: tuple[str, ...] = (
    # text encoders
    "bert", "roberta", "distilbert", "xlm-roberta", "albert", "electra", "deberta", "deberta-v2", "mpnet",
    "camembert", "modernbert",
    # decoders
    "gpt2", "llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "gemma", "gemma2",
    "gemma3_text", "phi", "phi3", "falcon", "gpt_neox", "gptj", "gpt_neo", "opt", "bloom", "starcoder2", "stablelm",
    "olmo", "olmo2", "granite", "cohere", "smollm3",
    # encoder-decoders
    "t5", "mt5", "bart", "mbart", "marian", "pegasus", "m2m_100",
    # vision
    "vit", "deit", "convnext", "resnet", "swin", "beit", "dinov2", "mobilenet_v2", "efficientnet", "segformer",
    # audio and speech
    "wav2vec2", "hubert", "wavlm", "whisper",
    # text and image
    "clip", "siglip",
)
"""``--common``: 60 widely used architectures (model types) across modalities, for a stratified sweep of the
backends whose exports are too slow to sweep the whole zoo on a CPU."""


def load_results(path: Path) -> list[dict[str, Any]]:
    """Read a ``results.jsonl``; a line cut short by an interruption is ignored (its case runs again).

    Args:
        path: the ``results.jsonl`` file (missing: no records).

    Returns:
        The records in file order; a later record of the same case replaces the earlier one.
    """
    if not path.exists():
        return []
    records: dict[str, dict[str, Any]] = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and "case_id" in record and record.get("status") in STATUSES:
            records[record["case_id"]] = record
    return list(records.values())
