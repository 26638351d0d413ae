"""E05: a whole model in bfloat16 (tiny RobertaForSequenceClassification `.to(torch.bfloat16)`)
(pytorch/pytorch#143643, https://github.com/pytorch/pytorch/issues/143643, closed, "Full bfloat16 ONNX export
fails": roberta-base in bf16 exports, then ONNX Runtime cannot run it on CPU; related
microsoft/onnxruntime#26311, https://github.com/microsoft/onnxruntime/issues/26311, 2025, "bfloat16 causing an
error: NOT_IMPLEMENTED : Could not find an implementation for MatMul(13)").

Parameters, activations and logits are bf16; inputs are int64 ids and an all-ones mask as in the report. Batch
and sequence are dynamic.

Expected: eager bf16 logits (2, 3) within bf16 tolerance (TOL = 2e-2 abs / 2e-2 rel; hfexport gets the same
atol/rtol through HF_OPTIONS), and from the same program at batch 3, sequence 9.
"""
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
import torch
from torch.export import Dim
from transformers import RobertaConfig, RobertaForSequenceClassification

B, S = Dim("batch", min=1, max=8), Dim("seq", min=2, max=32)
DYNAMIC_SHAPES = {"input_ids": {0: B, 1: S}, "attention_mask": {0: B, 1: S}}
REF_CONFIG = {"dynamic_shapes": DYNAMIC_SHAPES}
HF_OPTIONS = {"dynamic_shapes": DYNAMIC_SHAPES, "atol": 2e-2, "rtol": 2e-2}
TOL = (2e-2, 2e-2)


def _model():
    torch.manual_seed(0)
    cfg = RobertaConfig(vocab_size=128, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=64, num_labels=3, pad_token_id=1,
                        attn_implementation="sdpa")
    model = RobertaForSequenceClassification(cfg).eval()
    with torch.no_grad():  # logits of order 1, so that the bf16 tolerance below is not trivially met
        model.classifier.out_proj.weight.mul_(100.0)
    return model.to(torch.bfloat16)


def _inputs(model, b, s):
    inputs = {"input_ids": torch.randint(3, 128, (b, s), generator=torch.Generator().manual_seed(b * 10 + s)),
              "attention_mask": torch.ones(b, s, dtype=torch.long)}
    with torch.no_grad():
        return inputs, model(**inputs).logits


def build():
    model = _model()
    return (model, *_inputs(model, 2, 7))


def ALT_INPUTS():
    return _inputs(_model(), 3, 9)
