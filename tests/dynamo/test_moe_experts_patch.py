"""``_patch_moe_experts_dense`` (d01): what each backend does with transformers' MoE experts dispatch without it
(``disable=("_patch_moe_experts_dense",)``), and that the dense formulation is the value of every built-in
experts implementation, declining what it does not fit."""

from __future__ import annotations

import pytest
import torch
from transformers import GptOssConfig, MixtralConfig, MixtralForCausalLM
from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS
from transformers.models.gpt_oss.modeling_gpt_oss import GptOssExperts
from transformers.models.mixtral.modeling_mixtral import MixtralExperts

import hfexport
import hfexport.plugin
import hfexport.workarounds
from hfexport import ExportError
from hfexport_dynamo._common_patches import _patch_moe_experts_dense

PATCH = "_patch_moe_experts_dense"
INPUTS = {"input_ids": torch.tensor([[1, 5, 9, 3, 7]]), "attention_mask": torch.ones(1, 5, dtype=torch.long)}


def tiny_mixtral(implementation: str) -> MixtralForCausalLM:
    torch.manual_seed(0)
    config = MixtralConfig(hidden_size=32, intermediate_size=32, num_hidden_layers=1, num_attention_heads=4,
                           num_key_value_heads=2, vocab_size=64, max_position_embeddings=32, num_local_experts=4,
                           num_experts_per_tok=2, use_cache=False)
    config._experts_implementation = implementation
    return MixtralForCausalLM(config).eval()


# What each experts implementation does to a backend without the patch: eager's loop over nonzero() stops
# torch.export itself; grouped_mm traces (an opaque custom op after histc) but ONNX has no translation for
# the custom op and ExecuTorch rejects histc (not Core ATen).
FAILURES = [
    ("eager", "dynamo", r"step torch.export.export failed.*GuardOnDataDependentSymNode"),
    ("grouped_mm", "onnx", r"No ONNX function found for <OpOverload\(op='transformers.grouped_mm_fallback'"),
    pytest.param("grouped_mm", "executorch-xnnpack", r"aten.histc.default is not in Core ATen",
                 marks=pytest.mark.slow),  # an ExecuTorch lowering: about 15 s on 2 cores
]


@pytest.mark.parametrize("implementation,backend,failure", FAILURES)
def test_experts_dispatch_fails_without_the_patch(implementation, backend, failure):
    with pytest.raises(ExportError, match=failure):
        hfexport.export(tiny_mixtral(implementation), INPUTS, backend=backend, disable=(PATCH,))

    exported = hfexport.export(tiny_mixtral(implementation), INPUTS, backend=backend)
    installed = [p["path"] for p in exported.manifest["workarounds"]["patches"] if p["name"].endswith(PATCH)]
    assert "transformers.models.mixtral.modeling_mixtral.MixtralExperts.forward" in installed  # every loaded one
    report = exported.verify(INPUTS, atol=1e-4, rtol=1e-3)
    assert report.passed, report


def _routing(tokens: int, num_experts: int, top_k: int, seed: int):
    generator = torch.Generator().manual_seed(seed)
    index = torch.stack([torch.randperm(num_experts, generator=generator)[:top_k] for _ in range(tokens)])
    weights = torch.rand(tokens, top_k, generator=generator)
    return index, weights / weights.sum(-1, keepdim=True)


def _experts(cls, config):
    torch.manual_seed(0)
    experts = cls(config).eval()
    with torch.no_grad():
        for parameter in experts.parameters():
            parameter.normal_(0, 0.1)
    return experts


EXPERTS = [
    (MixtralExperts, MixtralConfig(hidden_size=16, intermediate_size=24, num_local_experts=5)),
    (GptOssExperts, GptOssConfig(hidden_size=16, intermediate_size=24, num_local_experts=5)),  # transposed, bias
]


@pytest.mark.parametrize("cls,config", EXPERTS, ids=lambda v: getattr(v, "__name__", ""))
@pytest.mark.parametrize("implementation", ["eager", "batched_mm", "grouped_mm"])
def test_dense_dispatch_is_the_value_of_every_builtin_implementation(cls, config, implementation):
    config._experts_implementation = implementation
    experts = _experts(cls, config)
    hidden = torch.randn(7, 16, generator=torch.Generator().manual_seed(1))
    index, weights = _routing(7, 5, 2, seed=2)
    with torch.no_grad():
        expected = experts(hidden, index, weights)
        with hfexport.workarounds.patch_context(("dynamo",)) as report:
            assert any(p.endswith(f"{cls.__name__}.forward") for _, p in report.installed)
            actual = experts(hidden, index, weights)
    torch.testing.assert_close(actual, expected, atol=1e-5, rtol=1e-5)


def test_dense_dispatch_skips_unknown_experts_like_eager():
    """An index outside [0, num_experts) (expert-parallel sentinel) selects nothing, as eager's ``continue``."""
    config = MixtralConfig(hidden_size=16, intermediate_size=24, num_local_experts=5)
    config._experts_implementation = "eager"
    experts = _experts(MixtralExperts, config)
    hidden = torch.randn(4, 16, generator=torch.Generator().manual_seed(1))
    index = torch.tensor([[0, 5], [5, 3], [1, 2], [5, 5]])
    weights = torch.full((4, 2), 0.5)
    with torch.no_grad():
        expected = experts(hidden, index, weights)
        with hfexport.workarounds.patch_context(("dynamo",)):
            actual = experts(hidden, index, weights)
    torch.testing.assert_close(actual, expected, atol=1e-5, rtol=1e-5)
    assert torch.equal(actual[3], torch.zeros(16))


def test_declines_what_it_does_not_fit():
    def forward(self, hidden_states, top_k_index, top_k_weights):  # not use_experts_implementation's wrapper
        return hidden_states

    assert _patch_moe_experts_dense(forward) is forward

    # a user's own experts implementation is left to run (here: it records that it ran)
    calls = []
    ALL_EXPERTS_FUNCTIONS["hfexport_test_impl"] = lambda self, h, i, w: calls.append(1) or h
    try:
        config = MixtralConfig(hidden_size=16, intermediate_size=24, num_local_experts=5)
        config._experts_implementation = "hfexport_test_impl"
        experts = _experts(MixtralExperts, config)
        hidden = torch.randn(3, 16)
        index, weights = _routing(3, 5, 2, seed=3)
        with hfexport.workarounds.patch_context(("dynamo",)):
            assert experts(hidden, index, weights) is hidden
        assert calls == [1]
    finally:
        del ALL_EXPERTS_FUNCTIONS["hfexport_test_impl"]


@pytest.mark.slow  # builds the zoo's tiny config; about 20 s on an idle 2-core machine
def test_openai_privacy_filter_exports_with_dynamic_sequence_since_its_experts_run_dense():
    """Was an EXPORT_SKIPS entry (its experts loop over ``nonzero()``); the dense experts patch covers it."""
    from hfexport_sweep.zoo import build_case

    model, _, _ = build_case("openai_privacy_filter/OpenAIPrivacyFilterModel")
    vocab = model.config.vocab_size

    def inputs(seq: int) -> dict[str, torch.Tensor]:
        ids = torch.randint(0, vocab - 1, (2, seq), generator=torch.Generator().manual_seed(seq))
        return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}

    exported = hfexport.export(model, inputs(8), backend="dynamo", dynamic=True)
    assert exported.manifest["workarounds"]["patches"], "the experts patch was not installed"
    for seq in (5, 13):  # two sequence lengths other than the traced one
        report = exported.verify(inputs(seq), atol=1e-4)
        assert report.passed, str(report)
