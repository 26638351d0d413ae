"""S33 (sibling of d12, mutated buffers whose initial value matters): running statistics held as buffers and
updated in place with ``add_``/``mul_``/``copy_`` (BatchNorm-style momentum update, written by hand as
streaming normalizers and EMA trackers do). ``running_mean`` starts at a calibration value (non-zero), ``count``
at 1, ``total`` at zero; the output normalizes with the updated statistics, so it depends on every initial
value. On XNNPACK the float ``add``/``mul`` of the update are delegated, the ``copy_`` back into the buffer is
not: the initial value must reach the delegate's input too. Only the first call is compared.
"""
import torch


class RunningNorm(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("running_mean", torch.tensor([0.5, -1.0, 2.0, 0.25]))
        self.register_buffer("running_var", torch.full((4,), 2.0))
        self.register_buffer("count", torch.ones((), dtype=torch.long))
        self.register_buffer("total", torch.zeros(4), persistent=False)

    def forward(self, x):
        mean, var = x.mean(0), x.var(0, unbiased=False)
        self.running_mean.mul_(0.9).add_(0.1 * mean)
        self.running_var.mul_(0.9).add_(var, alpha=0.1)
        self.count.add_(x.shape[0])
        self.total.add_(x.sum(0))
        y = (x - self.running_mean) / torch.sqrt(self.running_var + 1e-5)
        return y, self.count * 1, self.total / self.count


def build():
    model = RunningNorm().eval()
    inputs = {"x": torch.randn(3, 4, generator=torch.Generator().manual_seed(0))}
    with torch.no_grad():
        expected = RunningNorm()(**inputs)  # a fresh copy, so `model` keeps its initial buffers
    return model, inputs, expected


if __name__ == "__main__":
    print(build()[2])
