"""Options of the ``openvino`` backend (:class:`OpenVINOConfig`), checked when the config is made."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hfexport import Quantization
from hfexport_dynamo import DynamoConfig

from ._quantize import resolve_openvino_quantization
from ._runner import INFERENCE_PRECISIONS, KV_CACHE_PRECISIONS

__all__ = ["OpenVINOConfig"]


@dataclass
class OpenVINOConfig(DynamoConfig):
    """Options of the ``openvino`` backend.

    Attributes:
        num_threads: the CPU plugin's ``INFERENCE_NUM_THREADS`` for the runner of the export (and, recorded in the
            manifest, of a loaded artifact); ``None`` lets OpenVINO choose (all physical cores). An int >= 1.
        compress_to_fp16: store the weights as float16 in ``openvino_model.bin`` (``openvino.save_model``'s own
            default, which hfexport turns off: float32 weights are what the verification against eager holds to
            1e-4). The CPU plugin computes in float32 either way (``INFERENCE_PRECISION_HINT=f32``).
        quantize: weight compression by NNCF (``nncf.compress_weights``) in stage 5: ``"int8-weights"`` (int8 per
            output channel) or ``"int4-weights"`` (int4 in groups of ``group_size``, default 128), or an
            ``hfexport.Quantization``; the export is then verified against float eager by cosine similarity.
        int4_ratio: with ``"int4-weights"``, the fraction of the MatMul weights NNCF stores in int4 (the others in
            int8), in ``(0, 1]``; recorded in the manifest's ``quantization`` section.
    """

    num_threads: int | None = None
    compress_to_fp16: bool = False
    quantize: str | Quantization | None = None
    int4_ratio: float = 1.0
    kv_cache: str = "growing"
    inference_precision: str = "f32"
    kv_cache_precision: str = "f32"
    tokenizer: Any = None

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.num_threads is not None and (isinstance(self.num_threads, bool) or not isinstance(self.num_threads, int)
                                             or self.num_threads < 1):
            raise ValueError(f"num_threads must be an int >= 1 (OpenVINO's INFERENCE_NUM_THREADS) or None, got "
                             f"{self.num_threads!r}")
        if not isinstance(self.compress_to_fp16, bool):
            raise TypeError(f"compress_to_fp16 must be True or False, got {self.compress_to_fp16!r}")
        if isinstance(self.int4_ratio, bool) or not isinstance(self.int4_ratio, int | float) \
                or not 0 < self.int4_ratio <= 1:
            raise ValueError(f"int4_ratio must be a number in (0, 1] (the share of weights in int4), got "
                             f"{self.int4_ratio!r}")
        if self.quantize is not None:  # a float export reads no quantization code
            self.quantize = resolve_openvino_quantization(self.quantize)
        for name, allowed, what in (("kv_cache", ("growing", "fixed"), "growing variables (OpenVINO GenAI's layout) "
                                     "or fixed max_cache_len positions"),
                                    ("inference_precision", INFERENCE_PRECISIONS, "INFERENCE_PRECISION_HINT"),
                                    ("kv_cache_precision", KV_CACHE_PRECISIONS, "KV_CACHE_PRECISION")):
            if getattr(self, name) not in allowed:
                raise ValueError(f"{name} must be one of {allowed} ({what}), got {getattr(self, name)!r}")
