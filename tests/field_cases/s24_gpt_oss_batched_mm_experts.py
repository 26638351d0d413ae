"""S24 (sibling of D01): GPT-OSS's MoE block (router + experts) with ``experts_implementation="batched_mm"``:
the other experts layout of transformers (weights transposed, biases, gate and up interleaved, the class's
own clamped SwiGLU ``_apply_gate``), top-2 of 4, on (2, seq, 64) hidden states with a dynamic sequence.
Expected: eager (hidden states, router scores); also at a second length. (The block, not the whole model:
GPT-OSS's attention sinks are another kind.)
"""
import torch
from torch.export import Dim
from transformers import GptOssConfig
from transformers.models.gpt_oss.modeling_gpt_oss import GptOssMLP

SEQ = Dim("seq", min=2, max=32)
DYNAMIC_SHAPES = ({1: SEQ},)


def _model():
    torch.manual_seed(0)
    config = GptOssConfig(hidden_size=64, intermediate_size=48, num_local_experts=4, num_experts_per_tok=2)
    config._experts_implementation = "batched_mm"
    model = GptOssMLP(config).eval()
    with torch.no_grad():  # GPT-OSS initialises router and expert biases to 0: draw every parameter
        for parameter in model.parameters():
            parameter.normal_(0, 0.1)
    return model


def _run(model, seq):
    inputs = (torch.randn(2, seq, 64, generator=torch.Generator().manual_seed(seq)),)
    with torch.no_grad():
        return inputs, model(*inputs)


def build():
    model = _model()
    inputs, expected = _run(model, 5)
    return model, inputs, expected


def ALT_INPUTS():
    return _run(_model(), 11)
