"""The stylizing step of ../legacy/stylize.py, modernised by hand: the running stats that
torch < 0.4 saved for InstanceNorm layers are dropped before loading."""

import json

import torch
from net import TransformerNet

torch.manual_seed(0)
content_image = torch.rand(1, 3, 6, 6) * 255
style_model = TransformerNet()
state = torch.load("model.pth", weights_only=True)
for key in [k for k in state if k.startswith(("in1.", "in2.")) and "running" in k]:
    del state[key]
style_model.load_state_dict(state)
with torch.no_grad():
    img = style_model(content_image)[0].clamp(0, 255).numpy()
print("RESULT " + json.dumps({"mean": float(img.mean()), "first": img[:, 0, 0].tolist()}))
