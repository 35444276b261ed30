"""A PyTorch 0.4-1.x era script: run unedited under `safetorch run`; prints JSON results."""

import json

import torch
import torch.nn as nn
from torch._six import container_abcs, int_classes, string_classes
from torch.autograd import Function, Variable

torch.manual_seed(0)
A = torch.tensor([[4.0, 1.0], [2.0, 3.0]], dtype=torch.float64)
B = torch.tensor([[1.0], [2.0]], dtype=torch.float64)
X, LU = torch.solve(B, A)
evals, _ = torch.symeig(A + A.t())
eig_vals, _ = torch.eig(A)
tall = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]], dtype=torch.float64)
sol, qr = torch.lstsq(torch.tensor([[1.0], [2.0], [4.0]], dtype=torch.float64), tall)
rank = torch.matrix_rank(torch.ones(3, 3))


class Square(Function):
    def forward(self, x):
        self.save_for_backward(x)
        return x * x

    def backward(self, grad):
        (x,) = self.saved_tensors
        return 2 * x * grad


w = Variable(torch.tensor([3.0]), requires_grad=True)
out = Square()(w)
out.sum().backward()

model = nn.Linear(2, 1)
pred = model(Variable(torch.ones(1, 2), volatile=True))
criterion = nn.MSELoss(size_average=False)
loss = criterion(model(torch.ones(4, 2)), torch.zeros(4, 1))
total = 0.0
total += loss.data[0]

print(
    json.dumps(
        {
            "six": [
                string_classes == (str, bytes),
                int_classes is int,
                container_abcs.Mapping.__module__ == "collections.abc",
            ],
            "X": X.flatten().tolist(),
            "LU": LU.flatten().tolist(),
            "evals": evals.tolist(),
            "eig": eig_vals.tolist(),
            "lstsq": sol.flatten().tolist(),
            "rank": int(rank),
            "grad": w.grad.tolist(),
            "pred_requires_grad": pred.requires_grad,
            "loss_is_sum": abs(float(total) - float(((model(torch.ones(4, 2))) ** 2).sum())) < 1e-6,
        }
    )
)
