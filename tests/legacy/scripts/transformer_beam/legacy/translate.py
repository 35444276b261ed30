# ruff: noqa
# fmt: off
"""A tiny attention model trained to reverse token sequences, decoded with beam search,
PyTorch 0.3 style (legacy idioms, unedited by design).

Re-creates, in our own words, the idioms of 2018 Transformer implementations (a
``ScaledDotProductAttention`` with ``self.temper = np.power(d_model, 0.5)``, ``Variable``
inputs, ``volatile=True`` at translation, ``loss.data[0]``, and a ``Beam`` class in another
module whose ``prev_k = best_scores_id / num_words`` relied on 0.3's truncating integer
division to find each hypothesis's beam). Random sequences stand in for a corpus.
"""
import json

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.autograd import Variable

from beam import BOS, Beam

torch.manual_seed(5)
VOCAB, LEN, D = 7, 4, 16


class ScaledDotProductAttention(nn.Module):
    def __init__(self, d_model):
        super(ScaledDotProductAttention, self).__init__()
        self.temper = np.power(d_model, 0.5)

    def forward(self, q, k, v):
        attn = torch.bmm(q, k.transpose(1, 2)) / self.temper
        attn = F.softmax(attn, dim=2)
        return torch.bmm(attn, v)


class Reverser(nn.Module):
    def __init__(self):
        super(Reverser, self).__init__()
        self.src_emb = nn.Embedding(VOCAB, D)
        self.tgt_emb = nn.Embedding(VOCAB, D)
        self.pos = nn.Embedding(LEN, D)
        self.attn = ScaledDotProductAttention(D)
        self.proj = nn.Linear(2 * D, VOCAB)

    def step(self, src, prev, t):
        positions = Variable(torch.arange(0, LEN).long())
        enc = self.src_emb(src) + self.pos(positions).unsqueeze(0)
        q = (self.tgt_emb(prev) + self.pos(Variable(torch.LongTensor([t])))).unsqueeze(1)
        ctx = self.attn(q, enc, enc)
        return F.log_softmax(self.proj(torch.cat([q, ctx], 2).squeeze(1)), dim=1)


model = Reverser()
optimizer = torch.optim.Adam(model.parameters(), lr=0.05)
src_data = torch.LongTensor(16, LEN).random_(1, VOCAB)
tgt_data = torch.from_numpy(src_data.numpy()[:, ::-1].copy())
losses = []
for epoch in range(12):
    src, tgt = Variable(src_data), Variable(tgt_data)
    prev = torch.cat([Variable(torch.LongTensor(16, 1).fill_(BOS)), tgt[:, :-1]], 1)
    optimizer.zero_grad()
    loss = 0
    for t in range(LEN):
        loss += F.nll_loss(model.step(src, prev[:, t], t), tgt[:, t])
    loss.backward()
    optimizer.step()
    losses.append(loss.data[0] / LEN)


def translate(sentence, beam_size=3):
    beam = Beam(beam_size)
    src = Variable(sentence.unsqueeze(0).expand(beam_size, LEN), volatile=True)
    for t in range(LEN):
        dec_input = Variable(beam.get_current_state(), volatile=True)
        word_lk = model.step(src, dec_input, t)
        beam.advance(word_lk.data)
    return beam.get_hypothesis(0)


hyps = [translate(src_data[i]) for i in range(3)]
print('RESULT ' + json.dumps({'losses': losses, 'hypotheses': hyps,
                              'sources': src_data[:3].tolist()}))
