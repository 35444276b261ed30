"""Demo: safe_copy, checked indexing with every mode, deferred errors, device helpers."""

from __future__ import annotations

import torch

import safetorch as st

x = torch.arange(6.0)
idx = torch.tensor([0, 5, 6])

print("index-check mode:", st.get_index_check(), "| accelerator:", st.accelerator_available())

# The CUDA path, forced on CPU: the bad index is caught before any kernel runs.
try:
    st.checked_index(x, idx, check="always")
except IndexError as e:
    print("raise   ->", type(e).__name__, e)

for mode in ("clip", "wrap", "fill"):
    print(f"{mode:<8}->", st.checked_index(x, idx, mode=mode, fill_value=-1.0).tolist())

st.index_select(x, 0, idx, mode="deferred")  # no host sync; recorded on the device
try:
    st.raise_deferred()
except IndexError as e:
    print("deferred->", e)

w = torch.ones(2, requires_grad=True)
snap = st.safe_copy({"w": w * 3, "epoch": 1})
print(
    "safe_copy: requires_grad",
    snap["w"].requires_grad,
    "| shares memory",
    snap["w"].data_ptr() == w.data_ptr(),
)

model = torch.nn.Linear(2, 2)
batch = {"x": torch.zeros(4, 2), "ids": ["a", "b", "c", "d"]}
print(
    "device_of(model):",
    st.device_of(model),
    "| same device:",
    st.assert_same_device(model, batch["x"]),
)
print("to_device:", st.to_device(batch, "cpu")["x"].device)
