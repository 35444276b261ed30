# ruff: noqa
# fmt: off
"""A word language model trained the PyTorch 0.3 way (legacy idioms, unedited by design).

Re-creates, in our own words, the idioms of pytorch/examples ``word_language_model``
(``main.py``, ``model.py``, ``generate.py``) as of March 2018 (BSD-3-Clause):
``repackage_hidden`` testing ``type(h) == Variable``, ``get_batch(..., evaluation=True)``
making ``Variable(..., volatile=evaluation)``, ``total_loss += loss.data`` read back as
``total_loss[0]``, ``clip_grad_norm``, the manual update ``p.data.add_(-lr, p.grad.data)``
and a whole-model checkpoint (``torch.save(model, f)``, reloaded with ``torch.load(f)``).
"""
import argparse
import json
import math
import time

import torch
import torch.nn as nn
from torch.autograd import Variable

import data
import model

parser = argparse.ArgumentParser(description='PyTorch RNN/LSTM Language Model')
parser.add_argument('--data', type=str, default='./data')
parser.add_argument('--model', type=str, default='LSTM')
parser.add_argument('--emsize', type=int, default=16)
parser.add_argument('--nhid', type=int, default=16)
parser.add_argument('--nlayers', type=int, default=2)
parser.add_argument('--lr', type=float, default=20)
parser.add_argument('--clip', type=float, default=0.25)
parser.add_argument('--epochs', type=int, default=2)
parser.add_argument('--batch_size', type=int, default=4)
parser.add_argument('--bptt', type=int, default=10)
parser.add_argument('--dropout', type=float, default=0.2)
parser.add_argument('--seed', type=int, default=1111)
parser.add_argument('--log-interval', type=int, default=10)
parser.add_argument('--save', type=str, default='model.pt')
args = parser.parse_args()

torch.manual_seed(args.seed)

corpus = data.Corpus(args.data)


def batchify(data, bsz):
    nbatch = data.size(0) // bsz
    data = data.narrow(0, 0, nbatch * bsz)
    data = data.view(bsz, -1).t().contiguous()
    return data


eval_batch_size = 4
train_data = batchify(corpus.train, args.batch_size)
val_data = batchify(corpus.valid, eval_batch_size)
test_data = batchify(corpus.test, eval_batch_size)

ntokens = len(corpus.dictionary)
model = model.RNNModel(args.model, ntokens, args.emsize, args.nhid, args.nlayers, args.dropout)

criterion = nn.CrossEntropyLoss()


def repackage_hidden(h):
    """Wraps hidden states in new Variables, to detach them from their history."""
    if type(h) == Variable:
        return Variable(h.data)
    else:
        return tuple(repackage_hidden(v) for v in h)


def get_batch(source, i, evaluation=False):
    seq_len = min(args.bptt, len(source) - 1 - i)
    data = Variable(source[i:i+seq_len], volatile=evaluation)
    target = Variable(source[i+1:i+1+seq_len].view(-1))
    return data, target


def evaluate(data_source):
    model.eval()
    total_loss = 0
    ntokens = len(corpus.dictionary)
    hidden = model.init_hidden(eval_batch_size)
    for i in range(0, data_source.size(0) - 1, args.bptt):
        data, targets = get_batch(data_source, i, evaluation=True)
        output, hidden = model(data, hidden)
        output_flat = output.view(-1, ntokens)
        total_loss += len(data) * criterion(output_flat, targets).data
        hidden = repackage_hidden(hidden)
    return total_loss[0] / len(data_source)


history = []


def train():
    model.train()
    total_loss = 0
    start_time = time.time()
    ntokens = len(corpus.dictionary)
    hidden = model.init_hidden(args.batch_size)
    for batch, i in enumerate(range(0, train_data.size(0) - 1, args.bptt)):
        data, targets = get_batch(train_data, i)
        hidden = repackage_hidden(hidden)
        model.zero_grad()
        output, hidden = model(data, hidden)
        loss = criterion(output.view(-1, ntokens), targets)
        loss.backward()

        torch.nn.utils.clip_grad_norm(model.parameters(), args.clip)
        for p in model.parameters():
            p.data.add_(-lr, p.grad.data)

        total_loss += loss.data
        history.append(loss.data[0])

        if batch % args.log_interval == 0 and batch > 0:
            cur_loss = total_loss[0] / args.log_interval
            elapsed = time.time() - start_time
            print('| epoch {:3d} | {:5d}/{:5d} batches | lr {:02.2f} | ms/batch {:5.2f} | '
                  'loss {:5.2f} | ppl {:8.2f}'.format(
                      epoch, batch, len(train_data) // args.bptt, lr,
                      elapsed * 1000 / args.log_interval, cur_loss, math.exp(cur_loss)))
            total_loss = 0
            start_time = time.time()


lr = args.lr
best_val_loss = None
val_losses = []
for epoch in range(1, args.epochs+1):
    epoch_start_time = time.time()
    train()
    val_loss = evaluate(val_data)
    val_losses.append(val_loss)
    print('| end of epoch {:3d} | valid loss {:5.2f} | valid ppl {:8.2f}'.format(
        epoch, val_loss, math.exp(val_loss)))
    if not best_val_loss or val_loss < best_val_loss:
        with open(args.save, 'wb') as f:
            torch.save(model, f)
        best_val_loss = val_loss
    else:
        lr /= 4.0

with open(args.save, 'rb') as f:
    model = torch.load(f)

test_loss = evaluate(test_data)
print('| End of training | test loss {:5.2f} | test ppl {:8.2f}'.format(
    test_loss, math.exp(test_loss)))
print('RESULT ' + json.dumps({'losses': history, 'val_losses': val_losses,
                              'test_loss': test_loss}))
