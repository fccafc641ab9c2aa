"""PyTorch twin of `jem-bench bench`: times one operation on the official JEM Wide-ResNet
(tests/fixtures/pytorch/wrn.py, the same architecture and parameter layout as jem-bench's) and
prints one JSON line with the same fields. Run by compare.py; needs torch.

  python ops.py --op train-step --batch 64 --threads 1
"""
import argparse
import json
import pathlib
import statistics
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "tests/fixtures/pytorch"))
from wrn import WideResNet  # noqa: E402

p = argparse.ArgumentParser()
p.add_argument("--op", required=True, choices=["forward", "train-step", "input-gradient", "sgld-step"])
p.add_argument("--batch", type=int, default=64)
p.add_argument("--depth", type=int, default=10)
p.add_argument("--width", type=int, default=1)
p.add_argument("--channels", type=int, default=1)
p.add_argument("--size", type=int, default=28)
p.add_argument("--threads", type=int, default=1)
p.add_argument("--reps", type=int, default=20)
p.add_argument("--warmup", type=int, default=3)
a = p.parse_args()

torch.set_num_threads(a.threads)
torch.manual_seed(0)
net = WideResNet(a.depth, a.width, 10, a.channels)
x = torch.rand(a.batch, a.channels, a.size, a.size)


def logits(images):
    return net((images - 0.5) / 0.5)  # jem-bench's models normalise inside; so does this twin


if a.op == "forward":
    net.eval()

    def call():
        with torch.no_grad():
            logits(x)

elif a.op == "train-step":
    y = torch.randint(0, 10, (a.batch,))
    opt = torch.optim.Adam(net.parameters(), lr=1e-4)

    def call():
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(logits(x), y).backward()
        opt.step()

else:
    for q in net.parameters():
        q.requires_grad_(False)

    def input_gradient(images):
        images = images.clone().requires_grad_(True)
        torch.logsumexp(logits(images), 1).sum().backward()
        return images.grad

    if a.op == "input-gradient":

        def call():
            input_gradient(x)

    else:
        # One SGLD step on the [-1, 1] scale, as jem-bench's: α s² ∇ + σ s ε per pixel, s = 0.5.
        def call():
            g = input_gradient(x)
            x + 1.0 * 0.25 * g + 0.01 * 0.5 * torch.randn_like(x)

for _ in range(a.warmup):
    call()
times = []
for _ in range(a.reps):
    t = time.perf_counter()
    call()
    times.append((time.perf_counter() - t) * 1e3)


def forward_flops():
    # Multiply-adds × 2 of every convolution and the head, as WideResNetConfig::forward_flops.
    total, hooks = [0], []

    def conv_hook(m, inp, out):
        total[0] += 2 * out.numel() // out.shape[0] * m.in_channels * m.kernel_size[0] * m.kernel_size[1] // m.groups

    def linear_hook(m, inp, out):
        total[0] += 2 * m.in_features * m.out_features

    for m in net.modules():
        if isinstance(m, torch.nn.Conv2d):
            hooks.append(m.register_forward_hook(conv_hook))
        elif isinstance(m, torch.nn.Linear):
            hooks.append(m.register_forward_hook(linear_hook))
    with torch.no_grad():
        net(torch.zeros(1, a.channels, a.size, a.size))
    for h in hooks:
        h.remove()
    return total[0] * a.batch


factor = {"forward": 1, "train-step": 3, "input-gradient": 2, "sgld-step": 2}[a.op]
print(json.dumps({
    "op": a.op,
    "model": f"WRN-{a.depth}-{a.width}",
    "batch": a.batch,
    "threads": torch.get_num_threads(),
    "reps": a.reps,
    "median_ms": statistics.median(times),
    "min_ms": min(times),
    "gflop_per_call": factor * forward_flops() / 1e9,
    "backend": f"pytorch-{torch.__version__}",
}))
