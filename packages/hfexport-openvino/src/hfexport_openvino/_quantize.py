"""Weight compression of the ``openvino`` backend: NNCF's ``compress_weights`` on the converted model, in stage 5
before the IR is saved (``OpenVINOConfig.quantize``).

Weights only: each ``MatMul``'s (and each embedding table's) constant weight is stored in int8 or int4 with its
scales and zero points, and OpenVINO's CPU plugin computes with the weights decompressed on the fly; activations
stay float32. The artifact is verified against float eager by cosine similarity (``hfexport.quantization.compare_quantized``:
the manifest's ``quantization`` section).
"""

from __future__ import annotations

import contextlib
import io
import logging
from collections import Counter
from typing import Any

from hfexport import Quantization
from hfexport.quantization import QuantizationRecipe, resolve_quantization

__all__ = ["OPENVINO_QUANTIZATION_RECIPES", "compress_weights", "resolve_openvino_quantization"]

# Default verification thresholds (cosine of the main output with float eager), below what was measured on the tiny
# seeded models of tests/openvino (int8: 0.9999; int4, group 16: 0.99); a broken compression lands far below.
OPENVINO_QUANTIZATION_RECIPES: dict[str, QuantizationRecipe] = {
    "int8-weights": QuantizationRecipe(
        "int8-weights", "NNCF compress_weights INT8_ASYM: every MatMul and embedding weight int8, one scale and zero "
        "point per output channel; activations float32", min_cosine=0.98),
    "int4-weights": QuantizationRecipe(
        "int4-weights", "NNCF compress_weights INT4_ASYM: MatMul weights int4 in groups of group_size input weights "
        "(OpenVINOConfig.int4_ratio of them; the others, the embedding table and the last MatMul int8 per channel); "
        "activations float32; a layer whose input width group_size does not divide gets the largest power of two "
        "(>= 32) that does (NNCF's group-size fallback ADJUST), else int8", min_cosine=0.9,
        options=("group_size", "ratio", "symmetric"), default_group_size=128),
}
_MODES = {"int8-weights": "INT8", "int4-weights": "INT4"}  # + _SYM or _ASYM (Quantization.symmetric; default ASYM)


def resolve_openvino_quantization(value: Any) -> Quantization | None:
    """``OpenVINOConfig.quantize`` resolved (:func:`hfexport.quantization.resolve_quantization`).

    Raises:
        ValueError: a recipe the backend does not support (naming those it does), or an option it does not take.
    """
    return resolve_quantization(value, OPENVINO_QUANTIZATION_RECIPES, "backend 'openvino'")


def _weights(model: Any) -> Counter[str]:
    """The element types of the model's constants, by count of bytes (``{"f32": ..., "u8": ..., "u4": ...}``)."""
    sizes: Counter[str] = Counter()
    for op in model.get_ordered_ops():
        if op.get_type_name() == "Constant":
            sizes[op.get_output_element_type(0).get_type_name()] += op.get_byte_size()
    return sizes


def compress_weights(model: Any, quantization: Quantization, ratio: float) -> tuple[Any, dict[str, Any]]:
    """``nncf.compress_weights`` of ``model`` (an ``openvino.Model``) with ``quantization``'s recipe.

    ``int4-weights`` runs with NNCF's ``group_size_fallback_mode=ADJUST``: a MatMul whose input width
    ``group_size`` does not divide (SmolLM2's 576 with the default 128) is compressed in groups of the largest
    power of two >= 32 that divides it, and int8 where none does, instead of NNCF's default ``InvalidGroupSizeError``.
    ``quantization.ratio`` (when set) overrides ``ratio`` (``OpenVINOConfig.int4_ratio``); ``quantization.symmetric``
    picks ``INT4_SYM``/``INT8_SYM`` (default: the ``_ASYM`` modes).

    Returns:
        the compressed model and the component manifest's ``quantization`` section: the recipe, NNCF's mode, group
        size and ratio, the verification threshold, and the bytes of the model's constants by element type before
        and after.
    """
    import nncf
    from nncf.quantization.advanced_parameters import AdvancedCompressionParameters, GroupSizeFallbackMode

    before = _weights(model)
    mode = getattr(nncf.CompressWeightsMode,
                   _MODES[quantization.recipe] + ("_SYM" if quantization.symmetric else "_ASYM"))
    options: dict[str, Any] = {"mode": mode}
    if quantization.recipe == "int4-weights":
        options.update(group_size=quantization.group_size,
                       ratio=quantization.ratio if quantization.ratio is not None else ratio,
                       advanced_parameters=AdvancedCompressionParameters(
                           group_size_fallback_mode=GroupSizeFallbackMode.ADJUST))
    nncf_logger = logging.getLogger("nncf")
    level = nncf_logger.level
    nncf_logger.setLevel(logging.ERROR)  # its bit-width statistics table at every call (the manifest has the sizes)
    try:  # and its progress bar (rich, on stdout), which it offers no switch for; errors still raise
        with contextlib.redirect_stdout(io.StringIO()):
            compressed = nncf.compress_weights(model, **options)
    finally:
        nncf_logger.setLevel(level)
    after = _weights(compressed)
    section = {"recipe": quantization.recipe, "tool": "nncf.compress_weights", "nncf": nncf.__version__,
               "mode": mode.value, "group_size": options.get("group_size"), "ratio": options.get("ratio"),
               **({"group_size_fallback": "adjust"} if "advanced_parameters" in options else {}),
               "min_cosine": quantization.min_cosine, "weights": "compressed per the recipe; activations float32",
               "constant_bytes_before": dict(before), "constant_bytes_after": dict(after)}
    return compressed, section
