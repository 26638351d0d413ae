"""What a large export costs on ExecuTorch: a tied weight stored once (``_weights.py``), torch's CIA ops collected
once per export (``_export_cost.py``, pipeline code), and the registered patches that replace ExecuTorch's costly
steps (each left out with ``disable=``: what it saves, and the same program either way)."""

from __future__ import annotations

import copy

import pytest
import torch

import hfexport

pytest.importorskip("executorch")


class TiedLM(torch.nn.Module):
    """Input and output embeddings share one tensor: ``aten.embedding`` on a portable kernel, the head in XNNPACK."""

    def __init__(self, vocab=512, hidden=64):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, hidden)
        self.hidden = torch.nn.Linear(hidden, hidden)
        self.head = torch.nn.Linear(hidden, vocab, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, input_ids):
        return self.head(torch.relu(self.hidden(self.embed(input_ids))))


class EarlyUser(torch.nn.Module):
    """A portable ``mean`` (3-d without keepdim, which XNNPACK refuses and no node fix rewrites) reads the first
    linear's output between the two linears of one partition: fusing the partition puts its call after the second,
    behind that user, which must then move."""

    def __init__(self):
        super().__init__()
        self.first, self.second = torch.nn.Linear(8, 8), torch.nn.Linear(8, 8)

    def forward(self, x):
        a = self.first(x)
        m = a.mean(-1)
        b = self.second(a)
        return b, m


def export(model, inputs, **options):
    return hfexport.export(model.eval(), copy.deepcopy(inputs), backend="executorch-xnnpack", **options)


def program_bytes(exported, tmp_path) -> dict[str, int]:
    exported.save(tmp_path)
    return {p.name: p.stat().st_size for p in tmp_path.iterdir() if p.suffix in (".pte", ".ptd")}


def test_a_tied_weight_is_stored_once(tmp_path):
    torch.manual_seed(0)
    model = TiedLM().eval()
    inputs = {"input_ids": torch.randint(0, 512, (2, 7))}
    exported = export(model, inputs)
    sizes = program_bytes(exported, tmp_path / "tied")
    weights = sum(p.numel() * p.element_size() for p in model.parameters())  # the tied tensor once
    assert set(sizes) == {"model.pte", "model.ptd"}
    assert sum(sizes.values()) < 1.1 * weights, (sizes, weights)  # was 1.8x: the 128 KiB table twice
    with torch.no_grad():
        expected = model(**inputs)
    loaded = hfexport.load(tmp_path / "tied")
    torch.testing.assert_close(loaded(**inputs), expected, atol=1e-5, rtol=0)

    untied = TiedLM().eval()
    untied.head.weight = torch.nn.Parameter(untied.embed.weight.detach().clone())
    assert set(program_bytes(export(untied, inputs), tmp_path / "untied")) == {"model.pte"}  # nothing shared


def test_patch_duplicated_constant_shares_its_tensor(monkeypatch):
    """The tied table that ``to_backend`` gives XNNPACK's partition its own placeholder for is the model's tensor, not
    a deep copy of it; the program is the same (it matches eager)."""
    from executorch.exir.backend.canonical_partitioners import duplicate_constant_node_pass as dup

    original, seen = dup.duplicate_constant_node, []

    def duplicate_constant_node(exported_program, candidate_node):
        before = set(exported_program.state_dict)
        result = original(exported_program, candidate_node)
        seen.extend(t.data_ptr() for k, t in exported_program.state_dict.items() if k not in before)
        return result

    import executorch.exir.backend.utils as backend_utils

    monkeypatch.setattr(backend_utils, "duplicate_constant_node", duplicate_constant_node)  # the patch wraps this
    torch.manual_seed(0)
    model = TiedLM().eval()
    inputs = {"input_ids": torch.randint(0, 512, (2, 7))}
    table = model.embed.weight.data_ptr()
    exported = export(model, inputs)
    assert seen and set(seen) == {table}
    with torch.no_grad():
        torch.testing.assert_close(exported(**inputs), model(**inputs), atol=1e-5, rtol=0)
    seen.clear()
    export(model, inputs, disable=("_patch_duplicated_constant_shares_its_tensor",))
    assert seen and table not in seen  # the partition's table copied


def test_patch_preprocess_copy_shares_weights(monkeypatch):
    """XNNPACK's ``preprocess`` gets the model's own weight tensors, not a copy of each."""
    from executorch.backends.xnnpack.xnnpack_preprocess import XnnpackBackend

    original, seen = XnnpackBackend.preprocess, []

    def preprocess(edge_program, compile_specs):
        seen.extend(t.data_ptr() for t in edge_program.state_dict.values())
        return original(edge_program, compile_specs)

    monkeypatch.setattr(XnnpackBackend, "preprocess", staticmethod(preprocess))
    model = EarlyUser().eval()
    own = {p.data_ptr() for p in model.parameters()}
    inputs = {"x": torch.randn(2, 3, 8)}
    export(model, inputs)
    assert seen and set(seen) <= own
    seen.clear()
    export(model, inputs, disable=("_patch_preprocess_copy_shares_weights",))
    assert seen and not set(seen) & own  # every weight copied once more before preprocess


def test_patch_partition_without_regenerating_the_graph(monkeypatch):
    """Without the patch, the owning graph is rebuilt (``legalize_graph``) once per partition; with it, never, and
    the program is the same (it matches eager, the partition's early user moved after its call)."""
    import executorch.exir.lowered_backend_module as lbm

    from hfexport_executorch.workarounds import executorch_patches

    original, calls = lbm.legalize_graph, []
    monkeypatch.setattr(lbm, "legalize_graph", lambda gm: calls.append(gm) or original(gm))
    sort, unsorted = executorch_patches._sort_in_place, []

    def sort_in_place(graph):
        position = {node: i for i, node in enumerate(graph.nodes)}
        unsorted.append(any(position[i] > position[n] for n in graph.nodes for i in n.all_input_nodes))
        sort(graph)

    monkeypatch.setattr(executorch_patches, "_sort_in_place", sort_in_place)
    model = EarlyUser().eval()
    inputs = {"x": torch.randn(2, 3, 8)}
    with torch.no_grad():
        expected = model(**inputs)
    for disable, rebuilds in (((), 0), (("_patch_partition_without_regenerating_the_graph",), 1)):
        calls.clear()
        exported = export(model, inputs, disable=disable)
        assert exported.manifest["executorch"]["delegates"] == 1
        assert len(calls) == rebuilds
        torch.testing.assert_close(exported(**inputs), expected, atol=1e-5, rtol=0)
    assert unsorted == [True]  # the fused call came after the mean that reads it: the sort moved the mean


def test_cia_ops_collected_once_per_export(monkeypatch):
    """Pipeline code, not a workaround: an export collects torch's preservable CIA ops once or twice (again when the
    lowering registers new ops), where without the cache every decomposition walks them (4 or more times for this
    module); the same program either way, and torch's function is back after the export."""
    import contextlib

    import torch.export.decomp_utils as decomp_utils
    import torch.export.exported_program as exported_program

    from hfexport_executorch import exporter_executorch

    walks = []
    counting = {}
    for module in (exported_program, decomp_utils):  # the names the cache wraps: it counts the walks it lets through
        original = module._collect_all_valid_cia_ops
        counting[module] = lambda original=original: walks.append(1) or original()
        monkeypatch.setattr(module, "_collect_all_valid_cia_ops", counting[module])
    model = EarlyUser().eval()
    inputs = {"x": torch.randn(2, 3, 8)}
    with torch.no_grad():
        expected = model(**inputs)
    exported = export(model, inputs)
    cached = len(walks)
    torch.testing.assert_close(exported(**inputs), expected, atol=1e-5, rtol=0)
    assert all(module._collect_all_valid_cia_ops is fn for module, fn in counting.items())  # uninstalled
    with pytest.raises(ValueError, match="disable names no workaround"):
        export(model, inputs, disable=("_patch_cia_ops_collected_once",))  # no longer a registered patch
    walks.clear()
    monkeypatch.setattr(exporter_executorch, "cia_ops_collected_once", contextlib.nullcontext)  # what it saves
    exported = export(model, inputs)
    torch.testing.assert_close(exported(**inputs), expected, atol=1e-5, rtol=0)
    assert cached <= 2 and len(walks) >= 4, (cached, len(walks))


def test_the_cia_ops_cache_is_shared_and_released_by_the_last_holder():
    import torch.export.decomp_utils as decomp_utils
    import torch.export.exported_program as exported_program

    from hfexport_executorch._export_cost import cia_ops_collected_once

    original = exported_program._collect_all_valid_cia_ops
    with cia_ops_collected_once():
        installed = exported_program._collect_all_valid_cia_ops
        assert installed is not original and decomp_utils._collect_all_valid_cia_ops is installed
        with cia_ops_collected_once():  # a nested export shares it
            assert exported_program._collect_all_valid_cia_ops is installed
        assert exported_program._collect_all_valid_cia_ops is installed
        first = installed()
        first.add("mine")  # each caller gets its own copy
        assert "mine" not in installed() and installed() == original()
    assert exported_program._collect_all_valid_cia_ops is original
    assert decomp_utils._collect_all_valid_cia_ops is original


def test_reset_lets_go_of_the_old_program_before_loading_again(monkeypatch):
    """The export's verification resets a program that mutates buffers: the runtime must not hold the old program
    (its delegates' packed weights, the size of the model) while it loads the new one."""
    from hfexport_executorch._runner import ExecutorchRunner

    exported = export(EarlyUser(), {"x": torch.randn(2, 3, 8)})
    runner = exported.default_component.runner
    original, held = ExecutorchRunner.open, []
    monkeypatch.setattr(ExecutorchRunner, "open", lambda self: held.append(self.program) or original(self))
    runner.reset()
    assert held == [None] and runner.program is not None


def test_only_a_large_program_is_collected_before_the_runtime_loads_it(monkeypatch, tmp_path):
    """Writing a lowered program collects its graphs (a full ``gc.collect()``: 0.2-0.5 s in a process holding torch,
    transformers and ExecuTorch) only where the program is ``COLLECT_FROM_BYTES`` or more: there its graphs and
    weights would be held twice while the runtime loads it; a tiny model's export skips that cost."""
    from hfexport_executorch import _runner

    class Manager:  # what program_writer calls on an ExecutorchProgramManager: write_to_file, nothing kept apart
        def __init__(self, size):
            self.size = size

        def write_to_file(self, file):
            file.write(b"\0" * self.size)

    calls = []
    monkeypatch.setattr(_runner.gc, "collect", lambda *args: calls.append(args) or 0)
    monkeypatch.setattr(_runner, "COLLECT_FROM_BYTES", 1000)
    for size, collected in ((999, 0), (1000, 1)):
        directory = tmp_path / str(size)
        directory.mkdir()
        assert _runner.program_writer(Manager(size))(directory) is None
        assert (directory / _runner.PROGRAM_FILE).stat().st_size == size
        assert len(calls) == collected, size
