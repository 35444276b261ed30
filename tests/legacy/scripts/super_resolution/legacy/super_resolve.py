# ruff: noqa
# fmt: off
"""Upscales an image with a model main.py saved whole (PyTorch 0.3 style, see main.py)."""
from __future__ import print_function

import argparse
import json

import torch
from torch.autograd import Variable

parser = argparse.ArgumentParser(description='PyTorch Super Res Example')
parser.add_argument('--model', type=str, default='model_epoch_2.pth')
opt = parser.parse_args()

torch.manual_seed(5)
y = torch.rand(8, 8)  # the Y channel of an image

model = torch.load(opt.model)
input = Variable(y).view(1, -1, y.size(1), y.size(0))

out = model(input)
out = out.cpu()
out_img_y = out.data[0].numpy()
out_img_y *= 255.0
out_img_y = out_img_y.clip(0, 255)
print('output image', out_img_y.shape)
print('RESULT ' + json.dumps({'shape': list(out_img_y.shape), 'mean': float(out_img_y.mean())}))
