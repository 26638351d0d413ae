"""``hfexport generate --audio``: a PCM WAV cut into the export's chunks, turned into log-mel features by the model's
own feature extractor (copied into the artifact), its audio tokens put in front of the prompt; the ids equal eager
``model.generate`` on the same features (issue 48: there was no --audio for the audio-text-to-text export)."""

from __future__ import annotations

import contextlib
import io
import json
import wave

import numpy as np
import pytest
import torch
from test_cli_generate import _tokenizer

from helpers import tiny_model
from hfexport import cli

AUDIO_TOKEN, TOKENS_PER_CHUNK, RATE = 99, 4, 5120  # the tiny Voxtral's 16 mels x 32 frames: 5120 samples, hop 160


@pytest.mark.slow
def test_generate_with_audio_equals_eager(tmp_path):
    from transformers import WhisperFeatureExtractor

    from hfexport_dynamo.tasks.generate_command import _read_wav

    model = tiny_model("voxtral")
    model.save_pretrained(tmp_path / "model")
    _tokenizer().save_pretrained(tmp_path / "model")
    extractor = WhisperFeatureExtractor(feature_size=16, sampling_rate=RATE, hop_length=160, chunk_length=1, n_fft=400)
    extractor.save_pretrained(tmp_path / "model")
    with wave.open(str(tmp_path / "a.wav"), "wb") as wav:
        wav.setnchannels(1), wav.setsampwidth(2), wav.setframerate(RATE)
        wav.writeframes((np.random.default_rng(0).standard_normal(4000) * 3000).astype(np.int16).tobytes())
    assert cli.main(["export", str(tmp_path / "model"), "--task", "audio-text-to-text", "--max-cache-len", "40",
                     "-o", str(tmp_path / "out")]) == 0
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        assert cli.main(["generate", str(tmp_path / "out"), "--prompt", "w5 w6", "--audio", str(tmp_path / "a.wav"),
                         "--max-new-tokens", "6", "--json"]) == 0
    result = json.loads(printed.getvalue())
    samples, _ = _read_wav(str(tmp_path / "a.wav"))
    features = extractor([samples], sampling_rate=RATE, return_tensors="pt", padding="max_length",
                         max_length=RATE)["input_features"]
    ids = torch.tensor([[AUDIO_TOKEN] * TOKENS_PER_CHUNK + [5, 6]])
    with torch.no_grad():
        expected = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), input_features=features,
                                  do_sample=False, max_new_tokens=6)
    assert result["sequences"] == expected.tolist()
