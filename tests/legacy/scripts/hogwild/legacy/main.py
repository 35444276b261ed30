# ruff: noqa
# fmt: off
"""Hogwild training: worker processes update one shared model, PyTorch 0.3 style (legacy
idioms, unedited by design).

Re-creates, in our own words, the idioms of pytorch/examples ``mnist_hogwild`` as of early
2018 (BSD-3-Clause): ``model.share_memory()``, ``torch.multiprocessing.Process`` workers
(forked on Linux after the parent already ran a convolution: OpenMP's thread pool exists),
``Variable`` batches and ``loss.data[0]`` in each worker's log, a test pass in the parent
with ``volatile=True`` and ``size_average=False``. The workers run one after another (the
original starts them together) so that the numbers are reproducible; random 12x12 digits
stand in for MNIST.
"""
from __future__ import print_function

import json

import torch
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim
from torch.autograd import Variable


class Net(nn.Module):
    def __init__(self):
        super(Net, self).__init__()
        self.conv1 = nn.Conv2d(1, 4, kernel_size=3)
        self.fc = nn.Linear(4 * 5 * 5, 3)

    def forward(self, x):
        x = F.relu(F.max_pool2d(self.conv1(x), 2))
        return F.log_softmax(self.fc(x.view(-1, 4 * 5 * 5)), dim=1)


def train(rank, model, data, target, queue):
    torch.manual_seed(10 + rank)
    optimizer = optim.SGD(model.parameters(), lr=0.05, momentum=0.5)
    losses = []
    for i in range(4):
        optimizer.zero_grad()
        output = model(Variable(data[rank, i]))
        loss = F.nll_loss(output, Variable(target[rank, i]))
        loss.backward()
        optimizer.step()
        losses.append(loss.data[0])
    queue.put(losses)


if __name__ == '__main__':
    torch.manual_seed(1)
    data = torch.randn(2, 4, 8, 1, 12, 12)
    target = torch.LongTensor(2, 4, 8).random_(0, 3)
    model = Net()
    model(Variable(data[0, 0]))  # the parent runs OpenMP regions before forking
    model.share_memory()
    queue = mp.Queue()
    losses = []
    for rank in range(2):
        p = mp.Process(target=train, args=(rank, model, data, target, queue))
        p.start()
        p.join()
        losses += queue.get(timeout=3)
    test = Variable(data[:, 0].contiguous().view(-1, 1, 12, 12), volatile=True)
    test_loss = F.nll_loss(model(test), Variable(target[:, 0].contiguous().view(-1)), size_average=False)
    print('Test loss: %.4f' % (test_loss.data[0] / 16))
    print('RESULT ' + json.dumps({'losses': losses, 'test_loss': test_loss.data[0] / 16}))
