"""``hfexport.export``: pick a backend by name and run its exporter."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ._artifact import ExportedModel
from ._discovery import get_backend
from ._exporter import ExportConfig
from ._stages import ProgressCallback

__all__ = ["export"]


def export(model: Any, inputs: Mapping[str, Any] | None = None, *, backend: str = "dynamo",
           dynamic: bool = False, config: ExportConfig | None = None, progress: ProgressCallback | None = None,
           **options: Any) -> ExportedModel:
    """Export ``model`` with ``backend`` and return the artifact, runnable on the backend's runtime.

    Args:
        model: a ``torch.nn.Module`` (a Transformers ``PreTrainedModel`` or any module), exported in eval
            mode; its training flags, attributes and patched methods are restored afterwards, also on error.
        inputs: forward keyword arguments (tensors, ``Cache`` objects, pytrees of tensors), e.g.
            ``{"input_ids": LongTensor[batch, seq], "attention_mask": LongTensor[batch, seq]}``. For a
            Transformers model they are built from its config when omitted.
        backend: a name from ``hfexport backends``: ``"dynamo"`` (.pt2), ``"onnx"``, ``"executorch-xnnpack"``,
            ``"executorch-cuda"``, or a third-party one.
        dynamic: make every input dimension dynamic (``Dim.AUTO``); torch.export specializes those it must.
        config: the backend's config object (``OnnxConfig(...)``); ``options`` override its fields.
        progress: called with a ``StageEvent`` at the start and end of every stage.
        **options: fields of the backend's config (``opset_version=18``, ``dynamic_shapes={...}``).

    Returns:
        An :class:`ExportedModel`: call it with the same keyword inputs, ``verify`` it, ``save_pretrained`` it.

    Raises:
        hfexport.UnknownBackendError: the backend is not installed (says which distribution to install).
        TypeError: an option the backend does not take (lists the ones it does).
        hfexport.InvalidInputError: model or inputs of the wrong kind.
        hfexport.ExportError: a stage failed (names backend, stage and model class; cause chained).
    """
    exporter_class = get_backend(backend).load_exporter()
    if dynamic:
        options["dynamic"] = True
    exporter = exporter_class(config, **options)
    return exporter.export(model, inputs, progress=progress)
