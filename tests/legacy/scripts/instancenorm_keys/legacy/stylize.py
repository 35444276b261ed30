# ruff: noqa
# fmt: off
"""Stylizes an image with a downloaded fast-neural-style checkpoint, PyTorch 0.3 style
(legacy idioms, unedited by design).

Re-creates, in our own words, the idioms of pytorch/examples ``fast_neural_style`` as of
2017 (BSD-3-Clause): ``style_model.load_state_dict(torch.load(args.model))`` of a
checkpoint whose InstanceNorm layers carry ``running_mean``/``running_var`` (torch < 0.4
wrote them; torch now refuses the load: "Unexpected running stats buffer(s)"), a
``Variable(content_image, volatile=True)`` and ``output.data[0]``. A random image stands in
for a photo.
"""
import json

import torch
from torch.autograd import Variable

from net import TransformerNet

torch.manual_seed(0)
content_image = torch.rand(1, 3, 6, 6) * 255
style_model = TransformerNet()
style_model.load_state_dict(torch.load('model.pth'))
output = style_model(Variable(content_image, volatile=True))
img = output.data[0].clamp(0, 255).numpy()
print('RESULT ' + json.dumps({'mean': float(img.mean()), 'first': img[:, 0, 0].tolist()}))
