"""S40 (d14's kind): Meta's reference-Llama rotary embedding, a *complex buffer* ``freqs_cis`` sliced by the
dynamic sequence length.

``precompute_freqs_cis`` stores ``torch.polar(ones, outer(t, inv_freq))`` (complex64) as a non-persistent buffer;
forward slices ``freqs_cis[:seq]``, reshapes it for broadcast to ``[1, seq, 1, head_dim/2]`` and applies
``view_as_real(view_as_complex(x.float().reshape(..., -1, 2)) * freqs_cis).flatten(3).type_as(x)`` to q and k
(``[batch, seq, heads, head_dim]``), then attends. The buffer is a lifted complex constant of the program (not a
computation), so the rewrite must convert the stored tensor itself.

Expected: the attention output (2, 5, 32) of a random input; ALT_INPUTS: (2, 9, 32) (same program, dynamic seq).
"""
import torch
from torch.export import Dim

MAX_SEQ, DIM, HEADS = 16, 32, 4
HEAD_DIM = DIM // HEADS


def precompute_freqs_cis(dim: int, end: int, theta: float = 10000.0) -> torch.Tensor:
    freqs = 1.0 / (theta ** (torch.arange(0, dim, 2)[: dim // 2].float() / dim))
    t = torch.arange(end, dtype=torch.float32)
    return torch.polar(torch.ones(end, dim // 2), torch.outer(t, freqs))


def apply_rotary_emb(xq, xk, freqs_cis):
    xq_ = torch.view_as_complex(xq.float().reshape(*xq.shape[:-1], -1, 2))
    xk_ = torch.view_as_complex(xk.float().reshape(*xk.shape[:-1], -1, 2))
    freqs_cis = freqs_cis.view(1, xq_.shape[1], 1, xq_.shape[-1])  # reshape_for_broadcast
    return (torch.view_as_real(xq_ * freqs_cis).flatten(3).type_as(xq),
            torch.view_as_real(xk_ * freqs_cis).flatten(3).type_as(xk))


class RefLlamaAttention(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.wq, self.wk, self.wv = (torch.nn.Linear(DIM, DIM, bias=False) for _ in range(3))
        self.wo = torch.nn.Linear(DIM, DIM, bias=False)
        self.register_buffer("freqs_cis", precompute_freqs_cis(HEAD_DIM, MAX_SEQ), persistent=False)

    def forward(self, x):
        b, s, _ = x.shape
        q = self.wq(x).view(b, s, HEADS, HEAD_DIM)
        k = self.wk(x).view(b, s, HEADS, HEAD_DIM)
        v = self.wv(x).view(b, s, HEADS, HEAD_DIM)
        q, k = apply_rotary_emb(q, k, self.freqs_cis[:s])
        out = torch.nn.functional.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                                               v.transpose(1, 2), is_causal=True)
        return self.wo(out.transpose(1, 2).reshape(b, s, DIM))


_MODEL = None


def _model():
    global _MODEL
    if _MODEL is None:
        torch.manual_seed(0)
        _MODEL = RefLlamaAttention().eval()
    return _MODEL


def _case(seq):
    model = _model()
    x = torch.randn(2, seq, DIM, generator=torch.Generator().manual_seed(seq))
    with torch.no_grad():
        return model, (x,), model(x)


DYNAMIC_SHAPES = ({1: Dim("seq", min=2, max=MAX_SEQ)},)


def build():
    return _case(5)


def ALT_INPUTS():  # noqa: N802 - the field-case contract's name
    _, inputs, expected = _case(9)
    return inputs, expected


if __name__ == "__main__":
    print(build()[2].shape, ALT_INPUTS()[1].shape)
