"""safetorch.nn demo: lint a conv-bias-before-BN model and fix it; SyncBN; BN recalibration."""

from __future__ import annotations

import copy
import warnings

import torch
import torch.nn as nn
import torch.nn.functional as F

import safetorch as st

torch.manual_seed(0)

print("== 1. lint_model: bias before BatchNorm, Dropout before BatchNorm ==")
model = nn.Sequential(
    nn.Conv2d(3, 16, 3, padding=1),  # bias=True by default: cancelled by the BN below
    nn.BatchNorm2d(16),
    nn.ReLU(),
    nn.Dropout(0.2),
    nn.Conv2d(16, 16, 3, padding=1, bias=False),
    nn.BatchNorm2d(16, momentum=0.99),  # Keras-style momentum
)
x = torch.randn(8, 3, 16, 16)
for _ in range(3):
    model(torch.randn(8, 3, 16, 16))  # some running statistics
for finding in st.lint_model(model, x):
    print(" ", finding)

before = copy.deepcopy(model).eval()
st.lint_model(model, fix=True)
model.eval()
diff = (model(x) - before(x)).abs().max().item()
print(f"  after fix=True: conv bias is {model[0].bias}; eval max |diff| = {diff:.2e}")
print("  remaining rules:", sorted({f.rule for f in st.lint_model(model)}))

print("\n== 2. upsample without the deprecation warning, bit-identical ==")
img = torch.randn(1, 3, 4, 4)
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    legacy = F.upsample_bilinear(img, scale_factor=2)
print(
    "  st.upsample_bilinear == F.upsample_bilinear:",
    torch.equal(st.upsample_bilinear(img, scale_factor=2), legacy),
)

print("\n== 3. convert_sync_batchnorm only where it means something ==")
net = nn.Sequential(nn.Conv2d(3, 8, 3, bias=False), nn.BatchNorm2d(8))
print("  no process group -> unchanged:", st.convert_sync_batchnorm(net) is net)
portable = st.convert_sync_batchnorm(net, policy="portable")
print("  policy='portable' ->", type(portable[1]).__name__, "(runs on CPU/gloo too)")
print("  reverted ->", type(st.revert_sync_batchnorm(portable)[1]).__name__)

print("\n== 4. eval far worse than train: stale BN statistics ==")
cnn = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU(), nn.Flatten())
loader = [torch.randn(16, 3, 8, 8) * 3 + 2 for _ in range(10)]
with torch.no_grad():
    cnn[0].weight.mul_(4)  # weights changed after the statistics were gathered
print("  " + str(st.bn_report(cnn)[0]).replace("\n", "\n  "))
probe = loader[0]
with torch.no_grad():
    train_out = cnn(probe)
    cnn[1].reset_running_stats()  # as if never updated
    with st.eval_mode(cnn):
        stale = (cnn(probe) - train_out).abs().mean().item()
    st.recalibrate_bn(cnn, loader)
    with st.eval_mode(cnn):
        fresh = (cnn(probe) - train_out).abs().mean().item()
print(f"  eval vs train mean |diff|: stale stats {stale:.3f} -> recalibrated {fresh:.3f}")
print("  model still in training mode:", cnn.training)
