"""Quantized exports: recipes, input checks and the accuracy report every backend shares."""

from ._quantization import (
    QuantizationRecipe,
    QuantizedVerificationReport,
    check_quantization_inputs,
    compare_quantized,
    file_bytes,
    quantized_model_reason,
    resolve_quantization,
    weight_bytes,
)

__all__ = [
    "QuantizationRecipe", "QuantizedVerificationReport", "check_quantization_inputs", "compare_quantized",
    "file_bytes", "quantized_model_reason", "resolve_quantization", "weight_bytes"
]
