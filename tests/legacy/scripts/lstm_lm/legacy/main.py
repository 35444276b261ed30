# ruff: noqa
# fmt: off
"""A batch-first LSTM language model over padded sentences, PyTorch 0.3 style (legacy
idioms, unedited by design).

Re-creates, in our own words, the idioms of 2017-2018 LSTM language models: a
``repackage_hidden`` that tests ``type(h) == Variable``, outputs turned batch-first and
masked with ``output.transpose(0, 1) * mask`` and then ``.view(-1, nhid)`` (0.3 returned
the product contiguous; torch now keeps the transposed strides, and ``view`` refuses them),
``total_loss += loss.data`` and ``total_loss[0] / n``. A random corpus stands in for
Penn Treebank.
"""
import json

import torch
import torch.nn as nn
from torch.autograd import Variable

torch.manual_seed(7)
ntoken, ninp, nhid, bptt, bsz = 20, 8, 12, 5, 4


def repackage_hidden(h):
    if type(h) == Variable:
        return Variable(h.data)
    else:
        return tuple(repackage_hidden(v) for v in h)


class RNNModel(nn.Module):
    def __init__(self):
        super(RNNModel, self).__init__()
        self.encoder = nn.Embedding(ntoken, ninp)
        self.rnn = nn.LSTM(ninp, nhid)
        self.decoder = nn.Linear(nhid, ntoken)

    def forward(self, input, hidden, mask):
        output, hidden = self.rnn(self.encoder(input), hidden)
        output = output.transpose(0, 1) * mask.unsqueeze(2)
        decoded = self.decoder(output.view(-1, nhid))
        return decoded.view(mask.size(0), mask.size(1), ntoken), hidden

    def init_hidden(self):
        weight = next(self.parameters()).data
        return (Variable(weight.new(1, bsz, nhid).zero_()),
                Variable(weight.new(1, bsz, nhid).zero_()))


corpus = torch.LongTensor(bptt * 6 + 1, bsz).random_(0, ntoken)
lengths = torch.LongTensor(bsz).random_(2, bptt + 1)
model = RNNModel()
criterion = nn.CrossEntropyLoss()
optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
hidden = model.init_hidden()
total_loss, losses = 0, []
for i in range(0, bptt * 6, bptt):
    data = Variable(corpus[i:i + bptt])
    targets = Variable(corpus[i + 1:i + 1 + bptt].t().contiguous())
    mask = Variable((torch.arange(0, bptt).unsqueeze(0).long() < lengths.unsqueeze(1)).float())
    hidden = repackage_hidden(hidden)
    model.zero_grad()
    output, hidden = model(data, hidden, mask)
    loss = criterion(output.view(-1, ntoken), targets.view(-1))
    loss.backward()
    torch.nn.utils.clip_grad_norm(model.parameters(), 0.25)
    optimizer.step()
    total_loss += loss.data
    losses.append(loss.data[0])
print('average loss %.4f' % (total_loss[0] / 6))
print('RESULT ' + json.dumps({'losses': losses, 'average': total_loss[0] / 6}))
