# ruff: noqa
# fmt: off
"""Samples words from the model main.py saved (PyTorch 0.3 style, see main.py)."""
import argparse
import json

import torch
from torch.autograd import Variable

import data

parser = argparse.ArgumentParser(description='PyTorch Language Model')
parser.add_argument('--data', type=str, default='./data')
parser.add_argument('--checkpoint', type=str, default='./model.pt')
parser.add_argument('--words', type=int, default=30)
parser.add_argument('--seed', type=int, default=1111)
parser.add_argument('--temperature', type=float, default=1.0)
args = parser.parse_args()

torch.manual_seed(args.seed)

with open(args.checkpoint, 'rb') as f:
    model = torch.load(f)
model.eval()
model.cpu()

corpus = data.Corpus(args.data)
ntokens = len(corpus.dictionary)
hidden = model.init_hidden(1)
input = Variable(torch.rand(1, 1).mul(ntokens).long(), volatile=True)

words = []
for i in range(args.words):
    output, hidden = model(input, hidden)
    word_weights = output.squeeze().data.div(args.temperature).exp().cpu()
    word_idx = torch.multinomial(word_weights, 1)[0]
    input.data.fill_(word_idx)
    word = corpus.dictionary.idx2word[word_idx]
    words.append(word)

print(' '.join(words))
print('RESULT ' + json.dumps({'words': words}))
