"""A ``.pt2`` is saved and loaded holding one copy of the weights (issue 44): ``save_program`` writes each weight
from its storage (torch's members, byte for byte), and ``read_pt2`` builds the weights on the buffer the checked
file was read into. ``benchmarks/bench_export_memory.py`` measures the same at a few hundred MB."""

from __future__ import annotations

import gc
import io
import os
from pathlib import Path

import pytest
import torch

import hfexport
from hfexport import IntegrityError
from hfexport.trust import artifact_bytes
from hfexport_dynamo._pt2 import _write_pt2, load_program, read_pt2, save_program


class _Tied(torch.nn.Module):
    """Tied weights (one storage, two names), a bf16 weight, a buffer, a lifted tensor constant."""

    def __init__(self, hidden: int = 16):
        super().__init__()
        self.embed = torch.nn.Embedding(32, hidden)
        self.head = torch.nn.Linear(hidden, 32, bias=False)
        self.head.weight = self.embed.weight
        self.scale = torch.nn.Parameter(torch.ones(hidden, dtype=torch.bfloat16))
        self.register_buffer("offset", torch.arange(hidden, dtype=torch.float32))
        self.constant = torch.linspace(0, 1, hidden)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        hidden = self.embed(ids) * self.scale.float() + self.offset + self.constant
        return self.head(hidden)


def _program() -> torch.export.ExportedProgram:
    torch.manual_seed(0)
    return torch.export.export(_Tied().eval(), (torch.tensor([[1, 2, 3]]),))


def test_save_program_writes_the_bytes_torch_export_save_writes(tmp_path: Path) -> None:
    program = _program()
    assert len({t.untyped_storage().data_ptr() for t in program.state_dict.values()}) < len(program.state_dict)
    assert program.constants  # the lifted constant is written too
    ours, theirs = io.BytesIO(), io.BytesIO()
    _write_pt2(program, ours)
    torch.export.save(program, theirs)
    assert ours.getvalue() == theirs.getvalue()


def test_loaded_weights_are_built_on_the_checked_bytes(tmp_path: Path) -> None:
    """The program's weights are views of the one buffer ``artifact_bytes(writable=True)`` read and hashed: no
    second copy, and what runs is what was hashed."""
    torch.manual_seed(0)
    model, ids = _Tied().eval(), torch.tensor([[4, 5, 6, 7]])
    directory = hfexport.export(model, {"ids": ids}).save_pretrained(tmp_path / "tied")
    manifest = hfexport.load(directory).manifest
    data = artifact_bytes(directory, manifest, "model.pt2", "model.pt2", writable=True)
    assert isinstance(data, bytearray)
    start = torch.frombuffer(data, dtype=torch.uint8).data_ptr()
    loaded = load_program(directory / "model.pt2", data=data)
    for name, tensor in (*loaded.state_dict.items(), *loaded.constants.items()):
        assert start <= tensor.data_ptr() < start + len(data), name
    torch.testing.assert_close(loaded.module()(ids), model(ids))


def test_a_damaged_weight_is_an_integrity_error(tmp_path: Path) -> None:
    """A weight's bytes are checked against the archive's CRC-32 where they are used in place (the manifest's hash
    is checked before; this is ``read_pt2`` alone)."""
    program = _program()
    save_program(program, tmp_path / "model.pt2")
    data = bytearray((tmp_path / "model.pt2").read_bytes())
    weight = program.state_dict["embed.weight"].detach().contiguous().view(torch.uint8).numpy().tobytes()
    at = data.index(weight)
    data[at + 5] ^= 0x40
    with pytest.raises(IntegrityError, match=r"data/weights/weight_[0-9].*Bad CRC-32"):
        read_pt2(tmp_path / "model.pt2", data=data)
    read_pt2(tmp_path / "model.pt2", data=(tmp_path / "model.pt2").read_bytes())  # bytes: copied, then the same


def _status(field: str) -> int:
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) * 1024 for line in status if line.startswith(field))


def _peak_added(run) -> tuple[int, object]:
    """Bytes the process's peak RSS rose above its RSS while ``run`` ran (``VmHWM`` reset first), and its result."""
    gc.collect()
    with open("/proc/self/clear_refs", "w") as clear:
        clear.write("5")
    before = _status("VmRSS:")
    result = run()
    return _status("VmHWM:") - before, result


@pytest.mark.skipif(not os.access("/proc/self/clear_refs", os.W_OK), reason="needs Linux's /proc/self/clear_refs")
def test_save_and_load_hold_one_copy_of_the_weights(tmp_path: Path) -> None:
    """64 MiB of weights in two tensors: saving adds less than a quarter of them to the peak RSS (measured 0.00x;
    through torch.export.save 1.00x, twice the largest tensor), loading about one copy (1.00x; before, 2.71x: the
    file's chunks, their join, each member's bytes and its bytearray)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(2048, 4096, bias=False), torch.nn.Linear(4096, 2048, bias=False))
    weights = sum(p.nbytes for p in model.parameters())
    exported = hfexport.export(model.eval(), {"input": torch.randn(1, 2048)})
    small = hfexport.export(torch.nn.Linear(4, 4).eval(), {"input": torch.randn(1, 4)})  # what a first save imports
    hfexport.load(small.save_pretrained(tmp_path / "small"))
    saved, directory = _peak_added(lambda: exported.save_pretrained(tmp_path / "big"))
    assert saved < 0.25 * weights, f"save added {saved / weights:.2f}x the weights"
    loaded, artifact = _peak_added(lambda: hfexport.load(directory))
    assert loaded < 1.25 * weights, f"load added {loaded / weights:.2f}x the weights"
    x = torch.randn(1, 2048)
    torch.testing.assert_close(artifact(input=x), model(x))
