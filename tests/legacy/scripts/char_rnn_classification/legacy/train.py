# ruff: noqa
# fmt: off
"""A character-level RNN name classifier, PyTorch 0.2/0.3 style (legacy idioms, unedited by
design).

Re-creates, in our own words, the idioms of spro/practical-pytorch
``char-rnn-classification`` (``train.py``, ``model.py``, ``predict.py``) as of September
2017 (MIT): ``train()`` returning ``output, loss.data[0]``, ``top_i[0][0]`` as the category
index, the manual update ``p.data.add_(-learning_rate, p.grad.data)``, ``nn.LogSoftmax()``
without ``dim``, and the whole model saved with ``torch.save(rnn, ...)`` for predict.py.
Made-up names of three made-up languages stand in for the names dataset.
"""
import json
import random

import torch
import torch.nn as nn
from torch.autograd import Variable

from data import all_categories, category_lines, lineToTensor, n_categories, n_letters
from model import RNN

n_hidden = 32
n_epochs = 60
print_every = 20
learning_rate = 0.005

random.seed(2)
torch.manual_seed(2)


def categoryFromOutput(output):
    top_n, top_i = output.data.topk(1)  # Tensor out of Variable with .data
    category_i = top_i[0][0]
    return all_categories[category_i], category_i


def randomChoice(l):
    return l[random.randint(0, len(l) - 1)]


def randomTrainingPair():
    category = randomChoice(all_categories)
    line = randomChoice(category_lines[category])
    category_tensor = Variable(torch.LongTensor([all_categories.index(category)]))
    line_tensor = Variable(lineToTensor(line))
    return category, line, category_tensor, line_tensor


rnn = RNN(n_letters, n_hidden, n_categories)
criterion = nn.NLLLoss()


def train(category_tensor, line_tensor):
    rnn.zero_grad()
    hidden = rnn.initHidden()

    for i in range(line_tensor.size()[0]):
        output, hidden = rnn(line_tensor[i], hidden)

    loss = criterion(output, category_tensor)
    loss.backward()

    for p in rnn.parameters():
        p.data.add_(-learning_rate, p.grad.data)

    return output, loss.data[0]


current_loss = 0
losses = []
for epoch in range(1, n_epochs + 1):
    category, line, category_tensor, line_tensor = randomTrainingPair()
    output, loss = train(category_tensor, line_tensor)
    current_loss += loss
    losses.append(loss)

    if epoch % print_every == 0:
        guess, guess_i = categoryFromOutput(output)
        correct = 'ok' if guess == category else 'wrong (%s)' % category
        print('%d %d%% %.4f %s / %s %s' % (epoch, epoch / n_epochs * 100, loss, line, guess,
                                          correct))

torch.save(rnn, 'char-rnn-classification.pt')
print('RESULT ' + json.dumps({'losses': losses, 'mean_loss': current_loss / n_epochs}))
