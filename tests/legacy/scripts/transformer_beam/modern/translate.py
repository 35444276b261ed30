"""The attention model and beam search of ../legacy/translate.py, modernised by hand."""

import json
import math

import torch
import torch.nn as nn
import torch.nn.functional as F
from beam import BOS, Beam

torch.manual_seed(5)
VOCAB, LEN, D = 7, 4, 16


class ScaledDotProductAttention(nn.Module):
    def __init__(self, d_model):
        super().__init__()
        self.temper = math.sqrt(d_model)

    def forward(self, q, k, v):
        attn = F.softmax(torch.bmm(q, k.transpose(1, 2)) / self.temper, dim=2)
        return torch.bmm(attn, v)


class Reverser(nn.Module):
    def __init__(self):
        super().__init__()
        self.src_emb = nn.Embedding(VOCAB, D)
        self.tgt_emb = nn.Embedding(VOCAB, D)
        self.pos = nn.Embedding(LEN, D)
        self.attn = ScaledDotProductAttention(D)
        self.proj = nn.Linear(2 * D, VOCAB)

    def step(self, src, prev, t):
        enc = self.src_emb(src) + self.pos(torch.arange(LEN)).unsqueeze(0)
        q = (self.tgt_emb(prev) + self.pos(torch.tensor([t]))).unsqueeze(1)
        ctx = self.attn(q, enc, enc)
        return F.log_softmax(self.proj(torch.cat([q, ctx], 2).squeeze(1)), dim=1)


model = Reverser()
optimizer = torch.optim.Adam(model.parameters(), lr=0.05)
src_data = torch.empty(16, LEN, dtype=torch.long).random_(1, VOCAB)
tgt_data = src_data.flip(1)
losses = []
for _ in range(12):
    prev = torch.cat([torch.full((16, 1), BOS, dtype=torch.long), tgt_data[:, :-1]], 1)
    optimizer.zero_grad()
    loss = sum(F.nll_loss(model.step(src_data, prev[:, t], t), tgt_data[:, t]) for t in range(LEN))
    loss.backward()
    optimizer.step()
    losses.append(loss.item() / LEN)


@torch.no_grad()
def translate(sentence, beam_size=3):
    beam = Beam(beam_size)
    src = sentence.unsqueeze(0).expand(beam_size, LEN)
    for t in range(LEN):
        beam.advance(model.step(src, beam.get_current_state(), t))
    return beam.get_hypothesis(0)


hyps = [translate(src_data[i]) for i in range(3)]
print(
    "RESULT " + json.dumps({"losses": losses, "hypotheses": hyps, "sources": src_data[:3].tolist()})
)
