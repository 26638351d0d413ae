"""An executorch-xnnpack export holds no second copy of the weights while it lowers (issue 44): the bytes that
XNNPACK's preprocess serializes for each weight, and the constants the emitter keeps for the ``.ptd``, go to
temporary files as ExecuTorch's ``FileBackedData`` (``_weights.named_data_on_disk``), which the serializers copy into
the written files. ``benchmarks/bench_export_memory.py --backend executorch-xnnpack --steps`` measures each stage at a
few hundred MB and at 0.5 B."""

from __future__ import annotations

import copy
import gc
import os
import tempfile
from pathlib import Path

import pytest
import torch

import hfexport

pytest.importorskip("executorch")

from hfexport_executorch import _weights  # noqa: E402

SPILL_PREFIX = "hfexport-executorch-weights-"


class _TiedDecoder(torch.nn.Module):
    """A decoder's weights in miniature: an embedding table that is also the output head (tied, as Qwen2-0.5B's: its
    weights go to ``model.ptd``), and layers of three bias-free projections of one input."""

    def __init__(self, hidden: int = 1024, layers: int = 4, vocab: int = 8192):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, hidden)
        self.layers = torch.nn.ModuleList(torch.nn.ModuleList(torch.nn.Linear(hidden, hidden, bias=False)
                                                              for _ in range(3)) for _ in range(layers))
        self.head = torch.nn.Linear(hidden, vocab, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids)
        for q, k, v in self.layers:
            x = torch.tanh(q(x) + k(x) * v(x))
        return self.head(x)


class _Untied(torch.nn.Module):
    """No shared weight: every weight stays in ``model.pte`` (XNNPACK's named data in the program's segments)."""

    def __init__(self):
        super().__init__()
        self.first, self.second = torch.nn.Linear(64, 128), torch.nn.Linear(128, 32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.second(torch.relu(self.first(x)))


def _spill_directories() -> set[str]:
    return {p.name for p in Path(tempfile.gettempdir()).glob(f"{SPILL_PREFIX}*")}


def _files(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir()) if p.suffix in (".pte", ".ptd")}


@pytest.mark.parametrize("make, inputs", [
    (lambda: _TiedDecoder(hidden=64, layers=1, vocab=512), {"ids": torch.tensor([[1, 2, 3, 4]])}),
    (_Untied, {"x": torch.randn(2, 64)}),
], ids=["tied-ptd", "untied-pte"])
def test_spilled_weights_write_the_same_files(make, inputs, tmp_path, monkeypatch) -> None:
    """With every blob spilled (the threshold at one byte), the export writes the same ``.pte`` and ``.ptd`` bytes as
    with none spilled, matches eager after a save and a load, and leaves no spill file behind."""
    torch.manual_seed(0)
    model = make().eval()
    (tmp_path / "tmp").mkdir()  # this test's own temporary directory: other workers' exports spill too
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    before = _spill_directories()
    spilled: list[int] = []
    spill = _weights._SpillDirectory.spill

    def counted(self, data):
        spilled.append(len(data))
        return spill(self, data)

    monkeypatch.setattr(_weights._SpillDirectory, "spill", counted)
    monkeypatch.setattr(_weights, "SPILL_FROM_BYTES", 1)
    exported = hfexport.export(model, copy.deepcopy(inputs), backend="executorch-xnnpack")
    exported.save(tmp_path / "spilled")
    assert spilled, "no blob was spilled"
    monkeypatch.setattr(_weights, "SPILL_FROM_BYTES", 1 << 62)
    count = len(spilled)
    hfexport.export(model, copy.deepcopy(inputs), backend="executorch-xnnpack").save(tmp_path / "kept")
    assert len(spilled) == count  # nothing spilled above the threshold
    assert _files(tmp_path / "spilled") == _files(tmp_path / "kept")
    with torch.no_grad():
        expected = model(**inputs)
    torch.testing.assert_close(hfexport.load(tmp_path / "spilled")(**inputs), expected, atol=1e-5, rtol=1e-5)
    del exported
    gc.collect()
    assert _spill_directories() <= before, "a spill directory outlived its export"


def _status(field: str) -> int:
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) * 1024 for line in status if line.startswith(field))


@pytest.mark.skipif(not os.access("/proc/self/clear_refs", os.W_OK), reason="needs Linux's /proc/self/clear_refs")
def test_export_holds_no_second_copy_of_the_weights_while_lowering() -> None:
    """An 80 MiB tied decoder: the export's peak RSS over the model's stays below 2.2x the weights, the runtime's load
    at its end being the largest step (XNNPACK's packed copy, 1x; the tied table read in place by the portable
    embedding, mapped and, as root, locked by the pybindings' loader, 0.4x; one partition's weights mapped while XNNPACK
    packs them). Measured 1.88-1.9x; without the spill 2.4x (XNNPACK's serialized bytes of every weight held from
    ``to_backend`` until the program was written)."""
    torch.manual_seed(0)
    model = _TiedDecoder().eval()
    weights = sum(p.nbytes for p in model.parameters())
    ids = torch.tensor([[1, 2, 3, 4]])
    hfexport.export(_TiedDecoder(hidden=8, layers=1, vocab=16).eval(), {"ids": ids}, backend="executorch-xnnpack")
    gc.collect()
    with open("/proc/self/clear_refs", "w") as clear:
        clear.write("5")
    before = _status("VmRSS:")
    exported = hfexport.export(model, {"ids": ids}, backend="executorch-xnnpack")
    added = _status("VmHWM:") - before
    assert exported.manifest["components"]["model"]["executorch"]["data_file"] == "model.ptd"
    assert added < 2.2 * weights, f"the export added {added / weights:.2f}x the weights to the peak RSS"
    with torch.no_grad():
        torch.testing.assert_close(exported(ids=ids), model(ids), atol=1e-4, rtol=1e-4)
