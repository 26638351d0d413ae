"""A buffer that forward mutates in place keeps its export-time value in a ``dynamo`` export (d12's kind): the
export owns a copy (running it leaves the user's model alone, running the model leaves the export alone), its
calls carry the state from call to call as eager does, and a save after a run writes the initial value."""

import copy

import torch

import hfexport


class PrefilledCache(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("k_cache", torch.ones(1, 6, 4), persistent=False)
        self.register_buffer("hits", torch.zeros(1))

    def forward(self, k_val, cache_position):
        self.k_cache.index_copy_(1, cache_position, k_val)
        self.hits.add_(1.0)
        return self.k_cache * 2.0 + self.hits


FIRST = {"k_val": torch.full((1, 2, 4), -3.0), "cache_position": torch.tensor([2, 3])}
SECOND = {"k_val": torch.full((1, 2, 4), 5.0), "cache_position": torch.tensor([0, 5])}


def eager(*calls):
    model = PrefilledCache()
    return [model(**copy.deepcopy(c)) for c in calls]


def test_dynamo_export_owns_its_mutated_buffers(tmp_path):
    model = PrefilledCache().eval()
    exported = hfexport.export(model, copy.deepcopy(FIRST), backend="dynamo")
    first, second = eager(FIRST, SECOND)
    torch.testing.assert_close(exported(**copy.deepcopy(FIRST)), first)
    assert torch.equal(model.k_cache, torch.ones(1, 6, 4)) and model.hits.item() == 0  # the model is untouched
    torch.testing.assert_close(exported(**copy.deepcopy(SECOND)), second)  # state carried, as in eager
    model(**copy.deepcopy(SECOND))  # the user runs the model: the export's initial value does not change
    loaded = hfexport.load(exported.save_pretrained(tmp_path / "cache"))  # saved after two runs
    torch.testing.assert_close(loaded(**copy.deepcopy(FIRST)), first)  # starts from the initial value
