"""The Functions of ../legacy/dann.py, modernised by hand (static forward/backward)."""

import json

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.autograd import Function


class LinearFunction(Function):
    @staticmethod
    def forward(ctx, input, weight, bias=None):
        ctx.save_for_backward(input, weight, bias)
        output = input.mm(weight.t())
        if bias is not None:
            output += bias.unsqueeze(0).expand_as(output)
        return output

    @staticmethod
    def backward(ctx, grad_output):
        input, weight, bias = ctx.saved_tensors
        grad_input = grad_weight = grad_bias = None
        if ctx.needs_input_grad[0]:
            grad_input = grad_output.mm(weight)
        if ctx.needs_input_grad[1]:
            grad_weight = grad_output.t().mm(input)
        if bias is not None and ctx.needs_input_grad[2]:
            grad_bias = grad_output.sum(0)
        return grad_input, grad_weight, grad_bias


class Linear(nn.Module):
    def __init__(self, input_features, output_features):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(output_features, input_features))
        self.bias = nn.Parameter(torch.empty(output_features))
        nn.init.uniform_(self.weight, -0.1, 0.1)
        nn.init.uniform_(self.bias, -0.1, 0.1)

    def forward(self, input):
        return LinearFunction.apply(input, self.weight, self.bias)


class GradReverse(Function):
    @staticmethod
    def forward(ctx, x, lambd):
        ctx.lambd = lambd
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad_output):
        return grad_output * -ctx.lambd, None


def grad_reverse(x, lambd):
    return GradReverse.apply(x, lambd)


torch.manual_seed(3)
features = Linear(20, 8)
label_head = nn.Linear(8, 2)
domain_head = nn.Linear(8, 2)
params = (
    list(features.parameters()) + list(label_head.parameters()) + list(domain_head.parameters())
)
optimizer = torch.optim.SGD(params, lr=0.1)

x = torch.randn(32, 20)
y = (x[:, 0] > 0).long()
domain = (x[:, 1] > 0).long()

losses = []
for step in range(10):
    optimizer.zero_grad()
    h = F.relu(features(x))
    label_loss = F.cross_entropy(label_head(h), y)
    domain_loss = F.cross_entropy(domain_head(grad_reverse(h, 0.5)), domain)
    loss = label_loss + domain_loss
    loss.backward()
    optimizer.step()
    losses.append([label_loss.item(), domain_loss.item()])
    print(f"step {step}: label {label_loss.item():.4f} domain {domain_loss.item():.4f}")

print(
    "RESULT "
    + json.dumps({"losses": losses, "weight_grad": float(features.weight.grad.abs().sum())})
)
