"""The embedded JEM (results/models/jem: JEM's Wide_ResNet, WRN-10-2 on MNIST) exported to ONNX,
as tests/fixtures/onnx/export_embedded.py exports the embedded baseline: the weights loaded with
`load_state_dict(strict=True)`, the input normalisation (mean 0.5, std 0.5) left outside the
graph for `import --mean 0.5 --std 0.5`. benches/onnx_native.py times it against the native
checkpoint. Needs torch and safetensors.

    python benches/pytorch/export_jem.py --out /tmp/jem.onnx
    target/release/jem-bench import /tmp/jem.onnx --data mnist --mean 0.5 --std 0.5 --out /tmp/onnx/jem
"""
import argparse
import os
import pathlib
import sys

import torch
from safetensors.torch import load_file

root = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(root / "tests/fixtures/onnx"))
from export_embedded import JemWrn  # noqa: E402

p = argparse.ArgumentParser()
p.add_argument("--out", required=True, help="the ONNX file to write")
a = p.parse_args()

model = JemWrn(depth=10, widen=2, channels=1, classes=10)
model.load_state_dict(load_file(str(root / "results/models/jem.safetensors")), strict=True)
model.eval()
torch.onnx.export(model, (torch.rand(2, 1, 28, 28),), a.out, opset_version=17, dynamo=False,
                  input_names=["input"], output_names=["logits"],
                  dynamic_axes={"input": {0: "batch"}, "logits": {0: "batch"}},
                  do_constant_folding=True)
print(a.out, os.path.getsize(a.out), "bytes")
