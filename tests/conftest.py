"""Shared fixtures: offline, seeded tiny models. Nothing here touches the network."""

from __future__ import annotations

import os

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest  # noqa: E402
import torch  # noqa: E402

torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))


from helpers import tiny_model  # noqa: E402


@pytest.fixture
def bert() -> torch.nn.Module:
    return tiny_model("bert")
