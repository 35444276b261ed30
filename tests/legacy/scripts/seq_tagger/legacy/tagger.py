# ruff: noqa
# fmt: off
"""An LSTM part-of-speech tagger, PyTorch 0.3 style (legacy idioms, unedited by design).

Re-creates, in our own words, the idioms of the 2017 PyTorch tutorial "Sequence Models and
LSTM Networks" and the taggers built from it: ``word_to_ix``/``ix_to_tag`` dicts,
``prepare_sequence`` returning a ``Variable``, ``self.hidden`` re-initialised per sentence,
``loss.data[0]``, and decoding with ``_, idx = scores.max(1)`` and ``ix_to_tag[idx[i]]``
(0.3's ``idx[i]`` was a Python int, a dict key). Made-up sentences stand in for a corpus.
"""
import json

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim
from torch.autograd import Variable

torch.manual_seed(1)
training_data = [
    ("the dog ate the apple".split(), ["DET", "NN", "V", "DET", "NN"]),
    ("everybody read that book".split(), ["NN", "V", "DET", "NN"]),
    ("the cat read a book".split(), ["DET", "NN", "V", "DET", "NN"]),
]
word_to_ix = {}
for sent, tags in training_data:
    for word in sent:
        if word not in word_to_ix:
            word_to_ix[word] = len(word_to_ix)
tag_to_ix = {"DET": 0, "NN": 1, "V": 2}
ix_to_tag = {v: k for k, v in tag_to_ix.items()}


def prepare_sequence(seq, to_ix):
    return Variable(torch.LongTensor([to_ix[w] for w in seq]))


class LSTMTagger(nn.Module):
    def __init__(self, embedding_dim, hidden_dim, vocab_size, tagset_size):
        super(LSTMTagger, self).__init__()
        self.hidden_dim = hidden_dim
        self.word_embeddings = nn.Embedding(vocab_size, embedding_dim)
        self.lstm = nn.LSTM(embedding_dim, hidden_dim)
        self.hidden2tag = nn.Linear(hidden_dim, tagset_size)
        self.hidden = self.init_hidden()

    def init_hidden(self):
        return (Variable(torch.zeros(1, 1, self.hidden_dim)),
                Variable(torch.zeros(1, 1, self.hidden_dim)))

    def forward(self, sentence):
        embeds = self.word_embeddings(sentence)
        lstm_out, self.hidden = self.lstm(embeds.view(len(sentence), 1, -1), self.hidden)
        tag_space = self.hidden2tag(lstm_out.view(len(sentence), -1))
        return F.log_softmax(tag_space, dim=1)


model = LSTMTagger(6, 6, len(word_to_ix), len(tag_to_ix))
loss_function = nn.NLLLoss()
optimizer = optim.SGD(model.parameters(), lr=0.1)
losses = []
for epoch in range(15):
    for sentence, tags in training_data:
        model.zero_grad()
        model.hidden = model.init_hidden()
        tag_scores = model(prepare_sequence(sentence, word_to_ix))
        loss = loss_function(tag_scores, prepare_sequence(tags, tag_to_ix))
        loss.backward()
        optimizer.step()
    losses.append(loss.data[0])

predicted = []
for sentence, _ in training_data:
    model.hidden = model.init_hidden()
    scores = model(prepare_sequence(sentence, word_to_ix))
    _, idx = scores.data.max(1)
    predicted.append([ix_to_tag[idx[i]] for i in range(len(sentence))])
print('RESULT ' + json.dumps({'losses': losses, 'tags': predicted}))
