"""The patch context: lazy resolution, reverse-order restore (also on error), nesting, skipped targets."""

import pytest
import torch

import hfexport
import hfexport.plugin
import hfexport.workarounds
from hfexport import ExportError, register_patch
from hfexport.workarounds import patch_context


class Widget:
    def ping(self):
        return "ping"

    @staticmethod
    def make():
        return "made"


class SubWidget(Widget):
    pass


ORIGINAL_WHERE = torch.where
ORIGINAL_VIEW = torch.Tensor.view


@register_patch("test.patching", "torch.where", "torch.Tensor.view")
def _patch_count_calls(original):
    """Count calls to torch.where and Tensor.view during an export."""
    def wrapper(*args, **kwargs):
        wrapper.calls += 1
        return original(*args, **kwargs)

    wrapper.calls = 0
    return wrapper


@register_patch("test.patching", f"{__name__}.Widget.ping", f"{__name__}.SubWidget.ping")
def _patch_ping(original):
    """Replace Widget.ping (and the inherited SubWidget.ping)."""
    return lambda self: "patched " + original(self)


@register_patch("test.patching", f"{__name__}.Widget.make")
def _patch_make(original):
    """Replace a staticmethod: it must stay a staticmethod."""
    return lambda: "patched " + original()


@register_patch("test.patching", "transformers.models.no_such_model.modeling_no_such_model.NoSuchModel.forward")
def _patch_missing_model(original):
    """A target the installed transformers lacks."""
    return original


def _assert_originals():
    assert torch.where is ORIGINAL_WHERE
    assert torch.Tensor.view is ORIGINAL_VIEW
    assert Widget().ping() == "ping" and SubWidget().ping() == "ping"
    assert "ping" not in vars(SubWidget)  # the inherited attribute is inherited again
    assert isinstance(vars(Widget)["make"], staticmethod) and Widget.make() == "made"


def test_patches_installed_inside_and_restored_after():
    with patch_context(["test.patching"]) as report:
        assert torch.where is not ORIGINAL_WHERE
        assert torch.Tensor.view is not ORIGINAL_VIEW
        assert Widget().ping() == "patched ping"
        assert SubWidget().ping() == "patched ping"
        assert Widget.make() == "patched made" and Widget().make() == "patched made"
        x = torch.arange(4.0)
        torch.where(x > 1, x, -x).view(2, 2)
        assert torch.where.calls == 1
    _assert_originals()
    installed = {p for _, p in report.installed}
    assert {"torch.where", "torch.Tensor.view", f"{__name__}.Widget.make"} <= installed


def test_unresolvable_target_is_skipped_and_reported():
    with patch_context(["test.patching"]) as report:
        pass
    [(reg, path, reason)] = report.skipped
    assert reg.name == "_patch_missing_model"
    assert "no_such_model" in path and "no_such_model" in reason
    assert report.as_dict()["skipped"][0]["reason"] == reason


def test_restored_when_body_raises():
    with pytest.raises(RuntimeError, match="boom"):
        with patch_context(["test.patching"]):
            assert Widget().ping() == "patched ping"
            raise RuntimeError("boom")
    _assert_originals()


def test_nested_contexts_restore_in_reverse_order():
    with patch_context(["test.patching"]):
        with patch_context(["test.patching"]):
            assert Widget().ping() == "patched patched ping"  # the inner patch wraps the outer one
        assert Widget().ping() == "patched ping"
    _assert_originals()


def test_disabled_patch_is_not_installed():
    with patch_context(["test.patching"], disabled=["_patch_ping"]):
        assert Widget().ping() == "ping"
        assert torch.where is not ORIGINAL_WHERE
    _assert_originals()


def test_resolve_path_errors_name_the_missing_part():
    with pytest.raises(hfexport.workarounds.UnresolvedTarget, match="has no attribute 'nope'"):
        hfexport.workarounds.resolve_path("torch.Tensor.nope")
    with pytest.raises(hfexport.workarounds.UnresolvedTarget, match="cannot be imported|no module"):
        hfexport.workarounds.resolve_path("not_a_package_xyz.thing")


class _DynamoPatchProbe(torch.nn.Module):
    def forward(self, x):
        return torch.where(x > 0, x, torch.zeros_like(x)).view(-1)


@register_patch("dynamo", f"{__name__}._DynamoPatchProbe.forward")
def _patch_probe_forward(original):
    """Raise inside the export when the probe is asked to (to test restore-on-error)."""
    def forward(self, x):
        if getattr(self, "explode", False):
            raise RuntimeError("exploded inside the trace")
        return original(self, x) * 2
    return forward


def test_export_applies_and_reverts_patches(monkeypatch):
    model = _DynamoPatchProbe()
    # verify=False: the probe's patch changes the value on purpose, so the export differs from eager
    exported = hfexport.export(model, {"x": torch.tensor([[-1.0, 2.0]])}, verify=False)
    assert exported.manifest["verification"]["passed"] is False
    assert torch.equal(exported(x=torch.tensor([[-1.0, 3.0]])), torch.tensor([0.0, 6.0]))  # patched forward
    assert torch.equal(model(torch.tensor([[-1.0, 3.0]])), torch.tensor([0.0, 3.0]))  # original again
    assert "_DynamoPatchProbe.forward" in str(exported.manifest["workarounds"]["patches"])


def test_export_failure_restores_everything():
    model = _DynamoPatchProbe()
    model.explode = True
    model.train()
    with pytest.raises(ExportError) as info:
        hfexport.export(model, {"x": torch.ones(1, 2)})
    err = info.value
    assert (err.backend, err.step, err.model_class) == ("dynamo", "torch.export.export", "_DynamoPatchProbe")
    assert isinstance(err.__cause__, RuntimeError) and "exploded" in str(err.__cause__)
    assert "dynamo export: step torch.export.export failed for _DynamoPatchProbe" in str(err)
    assert "forward" not in vars(_DynamoPatchProbe) or vars(_DynamoPatchProbe)["forward"].__name__ == "forward"
    assert _DynamoPatchProbe.forward.__qualname__ == "_DynamoPatchProbe.forward"
    assert model.training  # training flag restored
    _assert_originals()


class GadgetAlpha:
    def run(self):
        return "alpha"


class GadgetBeta:
    def run(self):
        return "beta"


class GadgetGamma(GadgetAlpha):  # inherits run: patched through its base, not twice
    pass


@register_patch("test.wildcard", f"{__name__}.Gadget*.run", "no_such_module_xyz.*.Thing.run")
def _patch_gadgets_but_beta(original):
    """Wildcard patch that declines one of its matches by returning the original."""
    if original.__qualname__.startswith("GadgetBeta"):
        return original
    return lambda self: "patched " + original(self)


def test_wildcard_path_matches_loaded_classes_and_factory_may_decline():
    with patch_context(["test.wildcard"]) as report:
        assert GadgetAlpha().run() == "patched alpha"
        assert GadgetBeta().run() == "beta"  # declined
        assert GadgetGamma().run() == "patched alpha"
    assert GadgetAlpha().run() == "alpha" and "run" in vars(GadgetAlpha)
    assert [p for _, p in report.installed] == [f"{__name__}.GadgetAlpha.run"]
    assert hfexport.workarounds.resolve_pattern("no_such_module_xyz.*.Thing.run") == []  # imports nothing
