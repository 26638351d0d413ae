"""S55 (sibling of e05, dtypes a CPU runtime cannot run): a whole tiny Llama in bfloat16 (RMSNorm, rotary
embeddings computed in float32 then cast to bfloat16, SDPA), logits of the last position. Batch and sequence are
dynamic.

Expected: eager bfloat16 logits within bfloat16 tolerance.
"""
import torch
from _tiny import tiny_llama
from torch.export import Dim

B, S = Dim("batch", min=1, max=8), Dim("seq", min=2, max=32)
DYNAMIC_SHAPES = ({0: B, 1: S},)
TOL = (3e-2, 3e-2)
HF_OPTIONS = {"atol": 3e-2, "rtol": 3e-2}


class LastLogits(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.llama = tiny_llama(num_hidden_layers=1).to(torch.bfloat16)

    def forward(self, input_ids):
        return self.llama(input_ids=input_ids, use_cache=False).logits[:, -1]


def _inputs(b, s):
    inputs = {"input_ids": torch.randint(0, 128, (b, s), generator=torch.Generator().manual_seed(b * 10 + s))}
    with torch.no_grad():
        return inputs, LastLogits().eval()(**inputs)


def build():
    return (LastLogits().eval(), *_inputs(2, 6))


def ALT_INPUTS():
    return _inputs(3, 9)
