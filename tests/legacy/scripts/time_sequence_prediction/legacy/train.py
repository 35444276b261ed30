# ruff: noqa
# fmt: off
"""Sine-wave prediction with two LSTMCells and LBFGS, PyTorch 0.3 style (legacy idioms,
unedited by design).

Re-creates, in our own words, the idioms of pytorch/examples
``time_sequence_prediction/train.py`` as of March 2018 (BSD-3-Clause): a numpy array
loaded with ``torch.load('traindata.pt')`` (generate_sine_wave.py saved it with
``torch.save``), ``Variable(..., requires_grad=False)`` states in ``.double()``, an LBFGS
closure printing ``loss.data.numpy()[0]``, a prediction of future values. Smaller than
the original (12 waves of 100 steps, 2 LBFGS steps, 16 hidden units, lr 0.5) and without plots.
"""
from __future__ import print_function

import json

import numpy as np
import torch
import torch.nn as nn
import torch.optim as optim
from torch.autograd import Variable


class Sequence(nn.Module):
    def __init__(self):
        super(Sequence, self).__init__()
        self.lstm1 = nn.LSTMCell(1, 16)
        self.lstm2 = nn.LSTMCell(16, 16)
        self.linear = nn.Linear(16, 1)

    def forward(self, input, future=0):
        outputs = []
        h_t = Variable(torch.zeros(input.size(0), 16).double(), requires_grad=False)
        c_t = Variable(torch.zeros(input.size(0), 16).double(), requires_grad=False)
        h_t2 = Variable(torch.zeros(input.size(0), 16).double(), requires_grad=False)
        c_t2 = Variable(torch.zeros(input.size(0), 16).double(), requires_grad=False)

        for i, input_t in enumerate(input.chunk(input.size(1), dim=1)):
            h_t, c_t = self.lstm1(input_t, (h_t, c_t))
            h_t2, c_t2 = self.lstm2(h_t, (h_t2, c_t2))
            output = self.linear(h_t2)
            outputs += [output]
        for i in range(future):  # if we should predict the future
            h_t, c_t = self.lstm1(output, (h_t, c_t))
            h_t2, c_t2 = self.lstm2(h_t, (h_t2, c_t2))
            output = self.linear(h_t2)
            outputs += [output]
        outputs = torch.stack(outputs, 1).squeeze(2)
        return outputs


if __name__ == '__main__':
    np.random.seed(0)
    torch.manual_seed(0)
    data = torch.load('traindata.pt')
    input = Variable(torch.from_numpy(data[3:, :-1]), requires_grad=False)
    target = Variable(torch.from_numpy(data[3:, 1:]), requires_grad=False)
    test_input = Variable(torch.from_numpy(data[:3, :-1]), requires_grad=False)
    test_target = Variable(torch.from_numpy(data[:3, 1:]), requires_grad=False)
    seq = Sequence()
    seq.double()
    criterion = nn.MSELoss()
    optimizer = optim.LBFGS(seq.parameters(), lr=0.5, max_iter=5)
    losses = []
    test_losses = []
    for i in range(2):
        print('STEP: ', i)

        def closure():
            optimizer.zero_grad()
            out = seq(input)
            loss = criterion(out, target)
            print('loss:', loss.data.numpy()[0])
            losses.append(float(loss.data.numpy()[0]))
            loss.backward()
            return loss
        optimizer.step(closure)
        future = 20
        pred = seq(test_input, future=future)
        loss = criterion(pred[:, :-future], test_target)
        print('test loss:', loss.data.numpy()[0])
        test_losses.append(float(loss.data.numpy()[0]))
        y = pred.data.numpy()
    print('RESULT ' + json.dumps({'losses': losses, 'test_losses': test_losses,
                                  'future_mean': float(y[:, -20:].mean())}))
