# ruff: noqa
# fmt: off
"""A two-layer ReLU network with a custom autograd Function, PyTorch 0.3 style
(legacy idioms, unedited by design).

Re-creates, in our own words, the idioms of jcjohnson/pytorch-examples
``autograd/two_layer_net_custom_function.py`` as of November 2017 (MIT): a legacy
``torch.autograd.Function`` with instance ``forward``/``backward`` using
``self.save_for_backward`` and ``self.saved_tensors``, an instance made per iteration
(``relu = MyReLU()``) and called, ``loss.data[0]``, and manual gradient descent on
``.data`` with two-space indentation.
"""
import json

import torch
from torch.autograd import Variable


class MyReLU(torch.autograd.Function):
  """ReLU written as a Function: forward clamps, backward masks the gradient."""

  def forward(self, input):
    # remember the input for the backward pass
    self.save_for_backward(input)
    return input.clamp(min=0)

  def backward(self, grad_output):
    input, = self.saved_tensors
    grad_input = grad_output.clone()
    grad_input[input < 0] = 0
    return grad_input


torch.manual_seed(0)
dtype = torch.FloatTensor
N, D_in, H, D_out = 16, 100, 50, 10

x = Variable(torch.randn(N, D_in).type(dtype), requires_grad=False)
y = Variable(torch.randn(N, D_out).type(dtype), requires_grad=False)
w1 = Variable(torch.randn(D_in, H).type(dtype), requires_grad=True)
w2 = Variable(torch.randn(H, D_out).type(dtype), requires_grad=True)

learning_rate = 1e-5
losses = []
for t in range(20):
  relu = MyReLU()
  y_pred = relu(x.mm(w1)).mm(w2)

  loss = (y_pred - y).pow(2).sum()
  print(t, loss.data[0])
  losses.append(loss.data[0])

  loss.backward()

  w1.data -= learning_rate * w1.grad.data
  w2.data -= learning_rate * w2.grad.data

  w1.grad.data.zero_()
  w2.grad.data.zero_()

print('RESULT ' + json.dumps({'losses': losses}))
