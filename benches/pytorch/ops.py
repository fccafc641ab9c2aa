"""PyTorch twin of `jem-bench bench`: times one operation on the official JEM Wide-ResNet
(tests/fixtures/pytorch/wrn.py, the same architecture and parameter layout as jem-bench's) and
prints one JSON line with the same fields. Run by compare.py; needs torch.

  python ops.py --op train-step --batch 64 --threads 1
  python ops.py --op jem-iteration --depth 16 --width 2
  python ops.py --op pgd-step --k 10 --grad full --chains 5 --batch 16
  python ops.py --op jem-iteration --device cuda
  python ops.py --arch preact-resnet18 --channels 3 --size 32 --op input-gradient
  python ops.py --arch preact-resnet18 --channels 3 --size 32 --export preact.onnx

`--arch preact-resnet18` times a CIFAR PreAct-ResNet-18 (tests/fixtures/onnx/make_fixtures.py's,
`--preact-width` channels in its first stage: 64 is the full network) instead of the WRN, on
[0, 1] pixels with no normalisation; `--export PATH` writes that seeded network to ONNX (as the
README exports a model, batch dynamic) and exits, so that `jem-bench bench --model PATH` times
the same network through its ONNX interpreter (compare.py does both). The training rows
(train-step, jem-iteration) are the WRN's only.

Each operation computes what jem-bench's does (src/bench.rs says what that is); the two that
are written out here rather than taken from a library:
- jem-iteration: one iteration of the official JEM training (`train_wrn_ebm.py`'s sample_q and
  loss, Grathwohl et al. 2020, Algorithm 1): `--batch` chains from a replay buffer of 10 000
  (each restarted from U(-1, 1) with probability 0.05), 20 SGLD steps with gradients to the
  input only, then CE(f(x), y) - (mean LSE f(x) - mean LSE f(x_q)) with data and samples in one
  forward pass (as jem-bench; the official code runs them as separate passes), backward, Adam.
- pgd-step: d sum CE / dx of the logits averaged over `--chains` chains of K SGLD steps started
  at x. `bpda`: the steps run on detached tensors, the gradient is taken at x_K and summed over
  the chains (the steps are the identity on the way back). `full`: every step's input gradient
  is taken with create_graph=True and the gradient goes back through all K steps (exact
  double backward; jem-bench forms the same Hessian-vector products from a finite difference of
  the logits and one reverse pass, see src/bench.rs).
SGLD runs on [0, 1] pixels as jem-bench's: x <- x + a s^2 grad + sigma s eps, s = 0.5 (the
[-1, 1] network scale), a = 1, sigma = 0.01.
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
OPS = ["forward", "train-step", "input-gradient", "sgld-step", "jem-iteration", "pgd-step"]
p.add_argument("--op", required=True, choices=OPS)
p.add_argument("--batch", type=int, default=64)
p.add_argument("--depth", type=int, default=10)
p.add_argument("--width", type=int, default=1)
p.add_argument("--channels", type=int, default=1)
p.add_argument("--size", type=int, default=28)
p.add_argument("--threads", type=int, default=1)
p.add_argument("--reps", type=int, default=20)
p.add_argument("--warmup", type=int, default=3)
p.add_argument("--max-seconds", type=float, default=None,
               help="cut the warm-up (at least 1 call) and the timed calls (at least 3) short "
               "once this many seconds have passed in each")
p.add_argument("--k", type=int, default=0, help="pgd-step: SGLD steps of the defence")
p.add_argument("--grad", choices=["bpda", "full"], default="bpda", help="pgd-step, K > 0")
p.add_argument("--chains", type=int, default=5, help="pgd-step, K > 0: chains per image")
p.add_argument("--device", default="cpu", help="cpu, or cuda[:N]: compute on that GPU")
p.add_argument("--arch", choices=["wrn", "preact-resnet18"], default="wrn",
               help="the network: the JEM WRN of --depth/--width, or a PreAct-ResNet-18 (3x32x32)")
p.add_argument("--preact-width", type=int, default=64,
               help="preact-resnet18: channels of its first stage (64: the full network)")
p.add_argument("--export", help="write the seeded network to this ONNX file and exit")
a = p.parse_args()
if a.arch == "preact-resnet18" and a.op in ("train-step", "jem-iteration"):
    sys.exit(f"--op {a.op}: timed on the WRN only (jem-bench trains its own Wide-ResNets only)")
# On a GPU, true f32 as jem-bench computes there: cuDNN's convolutions would otherwise run in
# TF32 (PyTorch's default for them).
torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False

SGLD_STEPS, SGLD_LR, SGLD_STD = 20, 1.0, 0.01  # the official JEM's, as jem-bench's defaults
BUFFER_SIZE, REINIT_FREQ = 10_000, 0.05
# Pixels per network unit: [0, 1] pixels are [-1, 1] to the WRN; the PreAct-ResNet takes them as
# they are (its ONNX export has no normalisation, and jem-bench runs a bare graph on that scale).
SCALE = 0.5 if a.arch == "wrn" else 1.0
DRIFT, SPREAD = SGLD_LR * SCALE * SCALE, SGLD_STD * SCALE

torch.set_num_threads(a.threads)
torch.manual_seed(0)
dev = torch.device(a.device)
if a.arch == "wrn":
    net = WideResNet(a.depth, a.width, 10, a.channels).to(dev)
    model_name = f"WRN-{a.depth}-{a.width}"
else:
    if (a.channels, a.size) != (3, 32):
        sys.exit("--arch preact-resnet18: the network is CIFAR-shaped; pass --channels 3 --size 32")
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "tests/fixtures/onnx"))
    from make_fixtures import PreActResNet18  # noqa: E402

    net = PreActResNet18(width=a.preact_width).to(dev).eval()
    model_name = f"PreAct-ResNet-18 (width {a.preact_width})"
x = torch.rand(a.batch, a.channels, a.size, a.size, device=dev)
if a.export:
    torch.onnx.export(net.eval(), (x[:1].cpu(),), a.export, dynamo=False, input_names=["x"],
                      output_names=["logits"], dynamic_axes={"x": {0: "batch"}, "logits": {0: "batch"}})
    print(json.dumps({"exported": a.export, "model": model_name}))
    sys.exit(0)


def logits(images):
    if a.arch != "wrn":
        return net(images)  # [0, 1] pixels, as the bare ONNX graph takes them
    return net((images - 0.5) / 0.5)  # jem-bench's models normalise inside; so does this twin


if a.op == "forward":
    net.eval()

    def call():
        with torch.no_grad():
            logits(x)

elif a.op == "train-step":
    y = torch.randint(0, 10, (a.batch,), device=dev)
    opt = torch.optim.Adam(net.parameters(), lr=1e-4)

    def call():
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(logits(x), y).backward()
        opt.step()

elif a.op == "jem-iteration":
    y = torch.arange(a.batch, device=dev) % 10
    opt = torch.optim.Adam(net.parameters(), lr=1e-4)
    # The buffer's chains start as U(-1, 1) on the network's scale: U(0, 1) pixels.
    buffer = torch.rand(BUFFER_SIZE, a.channels, a.size, a.size, device=dev)

    def call():
        slots = torch.randint(0, BUFFER_SIZE, (a.batch,), device=dev)
        xq = buffer[slots]
        fresh = torch.rand(a.batch, device=dev) < REINIT_FREQ
        xq[fresh] = torch.rand(int(fresh.sum()), a.channels, a.size, a.size, device=dev)
        # sample_q: gradients to the chains only (autograd.grad skips the weights' gradients).
        for _ in range(SGLD_STEPS):
            xq = xq.detach().requires_grad_(True)
            g = torch.autograd.grad(torch.logsumexp(logits(xq), 1).sum(), [xq])[0]
            xq = xq.detach() + DRIFT * g + SPREAD * torch.randn_like(xq)
        buffer[slots] = xq
        out = logits(torch.cat([x, xq]))
        lse = torch.logsumexp(out, 1)
        loss = F.cross_entropy(out[: a.batch], y) - (lse[: a.batch].mean() - lse[a.batch:].mean())
        opt.zero_grad(set_to_none=True)
        loss.backward()
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

    elif a.op == "sgld-step":
        # One SGLD step on the [-1, 1] scale, as jem-bench's: α s² ∇ + σ s ε per pixel, s = 0.5.
        def call():
            g = input_gradient(x)
            x + DRIFT * g + SPREAD * torch.randn_like(x)

    else:
        y = torch.randint(0, 10, (a.batch,), device=dev)
        assert a.k == 0 or a.chains >= 1, "--chains: expected at least 1 for K > 0"

        def ce_of_average(chain_logits):
            # Chain-major rows (chain c of image i is row c*N + i), as jem-bench's defence.
            avg = chain_logits.view(a.chains, a.batch, -1).mean(0)
            return F.cross_entropy(avg, y, reduction="sum")

        if a.k == 0:

            def call():
                xg = x.clone().requires_grad_(True)
                torch.autograd.grad(F.cross_entropy(logits(xg), y, reduction="sum"), [xg])

        elif a.grad == "bpda":

            def call():
                s = x.repeat(a.chains, 1, 1, 1)
                # Each step starts from a detached state: nothing of the chain is kept for the
                # way back.
                for _ in range(a.k):
                    s = s.detach().requires_grad_(True)
                    g = torch.autograd.grad(torch.logsumexp(logits(s), 1).sum(), [s])[0]
                    s = s.detach() + DRIFT * g + SPREAD * torch.randn_like(s)
                s = s.detach().requires_grad_(True)
                g = torch.autograd.grad(ce_of_average(logits(s)), [s])[0]
                g.view(a.chains, a.batch, *x.shape[1:]).sum(0)

        else:

            def call():
                xg = x.clone().requires_grad_(True)
                s = xg.repeat(a.chains, 1, 1, 1)
                for _ in range(a.k):
                    g = torch.autograd.grad(torch.logsumexp(logits(s), 1).sum(), [s], create_graph=True)[0]
                    s = s + DRIFT * g + SPREAD * torch.randn_like(s)
                # repeat's backward sums the chains' gradients into x.
                torch.autograd.grad(ce_of_average(logits(s)), [xg])

# A GPU call returns once its kernels are queued: wait for them, as jem-bench's calls do by
# reading a result back.
if dev.type == "cuda":
    queued = call

    def call():
        queued()
        torch.cuda.synchronize(dev)

# As jem-bench's: --max-seconds bounds the warm-up (at least 1 call) and the timed calls (at
# least 3) alike.
started = time.perf_counter()
for i in range(a.warmup):
    if i >= 1 and a.max_seconds is not None and time.perf_counter() - started >= a.max_seconds:
        break
    call()
times = []
started = time.perf_counter()
while len(times) < a.reps and (
    len(times) < 3 or a.max_seconds is None or time.perf_counter() - started < a.max_seconds
):
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
        net(torch.zeros(1, a.channels, a.size, a.size, device=dev))
    for h in hooks:
        h.remove()
    return total[0] * a.batch


def factor():
    """FLOPs per call in units of F, the forward pass of one batch (jem-bench's convention:
    src/bench.rs derives each)."""
    fixed = {"forward": 1, "train-step": 3, "input-gradient": 2, "sgld-step": 2,
             # 20 input gradients on the chains, a training step on data + samples (2 x 3F).
             "jem-iteration": 2 * SGLD_STEPS + 6}
    if a.op in fixed:
        return fixed[a.op]
    if a.k == 0:
        return 2
    if a.grad == "bpda":
        return a.chains * (2 * a.k + 2)
    # Exact double backward: going back through a step (its forward and input-gradient passes,
    # 2F) costs about 2F more, so each step costs 4F in all, plus 2F for the final gradient.
    return a.chains * (4 * a.k + 2)


if a.op == "pgd-step":
    row = f"pgd-step k{a.k}" + (f" {a.grad}" if a.k > 0 else "")
else:
    row = a.op
result = {
    "op": a.op,
    "row": row,
    "model": model_name,
    "batch": a.batch,
    "threads": torch.get_num_threads(),
    "reps": len(times),
    "median_ms": statistics.median(times),
    "min_ms": min(times),
    "gflop_per_call": factor() * forward_flops() / 1e9,
    "backend": f"pytorch-{torch.__version__}",
    # The instruction set ATen's kernels run (ATEN_CPU_CAPABILITY caps it; oneDNN's cap is
    # ONEDNN_MAX_CPU_ISA).
    "isa": "f32" if dev.type == "cuda" else torch.backends.cpu.get_cpu_capability().lower(),
    "device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu",
}
if a.op == "jem-iteration":
    result["sgld_steps"] = SGLD_STEPS
if a.op == "pgd-step":
    result["k"] = a.k
    if a.k > 0:
        result.update(grad=a.grad, chains=a.chains)
print(json.dumps(result))
