# ruff: noqa
# fmt: off
"""Predicts the language of names with the RNN train.py saved whole (see train.py).

The original took ``torch`` and ``Variable`` from ``from model import *``; they are imported
here by name, since ``safetorch check`` does not resolve star imports (a documented limit).
"""
import json
import sys

import torch
from torch.autograd import Variable

from data import *  # noqa: F401,F403
from model import *  # noqa: F401,F403

rnn = torch.load('char-rnn-classification.pt')


def evaluate(line_tensor):
    hidden = rnn.initHidden()
    for i in range(line_tensor.size()[0]):
        output, hidden = rnn(line_tensor[i], hidden)
    return output


def predict(line, n_predictions=2):
    output = evaluate(Variable(lineToTensor(line)))

    topv, topi = output.data.topk(n_predictions, 1, True)
    predictions = []

    for i in range(n_predictions):
        value = topv[0][i]
        category_index = topi[0][i]
        print('(%.2f) %s' % (value, all_categories[category_index]))
        predictions.append(['%.4f' % value, all_categories[category_index]])

    return predictions


if __name__ == '__main__':
    names = sys.argv[1:] or ['Aldrael', 'Grakbor', 'Cessami']
    print('RESULT ' + json.dumps({'predictions': [predict(name) for name in names]}))
