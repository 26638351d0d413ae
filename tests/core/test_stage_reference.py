"""Each exporter file's `# ── Stage N: Title ──` banners match its stage data, in order."""

import importlib
import inspect
import re

import pytest

from hfexport import get_backend

BANNER = re.compile(r"^# ── Stage (\d+): (.+?) ──$", re.M)


@pytest.mark.parametrize("backend", ["dynamo", "onnx", "executorch-xnnpack"])
def test_banners_match_stage_data(backend):
    try:
        exporter = get_backend(backend).load_exporter()
    except ImportError as exc:  # pragma: no cover - a member not built yet
        pytest.skip(str(exc))
    source = inspect.getsource(importlib.import_module(exporter.__module__))
    banners = [(int(n), t) for n, t in BANNER.findall(source)]
    stages = [(s.number, s.title) for s in exporter.stages]
    assert banners == stages
    for s in exporter.stages:
        assert callable(getattr(exporter, s.method)), s
