"""Upscales an image with a model main.py saved whole (modernised by hand)."""

import argparse
import json

import torch

parser = argparse.ArgumentParser(description="PyTorch Super Res Example")
parser.add_argument("--model", type=str, default="model_epoch_2.pth")
opt = parser.parse_args()

torch.manual_seed(5)
y = torch.rand(8, 8)

model = torch.load(opt.model, weights_only=False)  # our own file: a whole pickled model
input = y.view(1, -1, y.size(1), y.size(0))
with torch.no_grad():
    out = model(input).cpu()
out_img_y = out[0].numpy()
out_img_y *= 255.0
out_img_y = out_img_y.clip(0, 255)
print("RESULT " + json.dumps({"shape": list(out_img_y.shape), "mean": float(out_img_y.mean())}))
