# ruff: noqa
# fmt: off
"""Legacy autograd Functions with state, PyTorch 0.2/0.3 style (legacy idioms, unedited by
design).

Re-creates, in our own words, two idioms of that era: the ``Linear`` Function of the 0.2
"Extending PyTorch" notes (instance ``forward(self, input, weight, bias=None)``,
``self.needs_input_grad``, a backward returning one gradient per input), wrapped in an
``nn.Module`` that calls ``LinearFunction()(...)``, and the gradient-reversal layer of the
DANN domain-adaptation repositories (``GradReverse(lambd)``: ``__init__`` stores the
coefficient, backward reads ``self.lambd``). A feature extractor and a domain classifier
train on random data.
"""
import json

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.autograd import Function, Variable


class LinearFunction(Function):
    def forward(self, input, weight, bias=None):
        self.save_for_backward(input, weight, bias)
        output = input.mm(weight.t())
        if bias is not None:
            output += bias.unsqueeze(0).expand_as(output)
        return output

    def backward(self, grad_output):
        input, weight, bias = self.saved_tensors
        grad_input = grad_weight = grad_bias = None
        if self.needs_input_grad[0]:
            grad_input = grad_output.mm(weight)
        if self.needs_input_grad[1]:
            grad_weight = grad_output.t().mm(input)
        if bias is not None and self.needs_input_grad[2]:
            grad_bias = grad_output.sum(0).squeeze(0)
        return grad_input, grad_weight, grad_bias


class Linear(nn.Module):
    def __init__(self, input_features, output_features):
        super(Linear, self).__init__()
        self.weight = nn.Parameter(torch.Tensor(output_features, input_features))
        self.bias = nn.Parameter(torch.Tensor(output_features))
        self.weight.data.uniform_(-0.1, 0.1)
        self.bias.data.uniform_(-0.1, 0.1)

    def forward(self, input):
        return LinearFunction()(input, self.weight, self.bias)


class GradReverse(Function):
    def __init__(self, lambd):
        super(GradReverse, self).__init__()
        self.lambd = lambd

    def forward(self, x):
        return x.view_as(x)

    def backward(self, grad_output):
        return grad_output * -self.lambd


def grad_reverse(x, lambd):
    return GradReverse(lambd)(x)


torch.manual_seed(3)
features = Linear(20, 8)
label_head = nn.Linear(8, 2)
domain_head = nn.Linear(8, 2)
params = list(features.parameters()) + list(label_head.parameters()) + list(domain_head.parameters())
optimizer = torch.optim.SGD(params, lr=0.1)

x = Variable(torch.randn(32, 20))
y = Variable((x.data[:, 0] > 0).long())
domain = Variable((x.data[:, 1] > 0).long())

losses = []
for step in range(10):
    optimizer.zero_grad()
    h = F.relu(features(x))
    label_loss = F.cross_entropy(label_head(h), y)
    domain_loss = F.cross_entropy(domain_head(grad_reverse(h, 0.5)), domain)
    loss = label_loss + domain_loss
    loss.backward()
    optimizer.step()
    losses.append([label_loss.data[0], domain_loss.data[0]])
    print('step %d: label %.4f domain %.4f' % (step, label_loss.data[0], domain_loss.data[0]))

print('RESULT ' + json.dumps({'losses': losses,
                              'weight_grad': float(features.weight.grad.data.abs().sum())}))
