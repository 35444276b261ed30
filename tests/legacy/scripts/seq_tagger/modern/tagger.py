"""The LSTM tagger of ../legacy/tagger.py, modernised by hand."""

import json

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim

torch.manual_seed(1)
training_data = [
    ("the dog ate the apple".split(), ["DET", "NN", "V", "DET", "NN"]),
    ("everybody read that book".split(), ["NN", "V", "DET", "NN"]),
    ("the cat read a book".split(), ["DET", "NN", "V", "DET", "NN"]),
]
word_to_ix = {}
for sent, _ in training_data:
    for word in sent:
        word_to_ix.setdefault(word, len(word_to_ix))
tag_to_ix = {"DET": 0, "NN": 1, "V": 2}
ix_to_tag = {v: k for k, v in tag_to_ix.items()}


def prepare_sequence(seq, to_ix):
    return torch.tensor([to_ix[w] for w in seq], dtype=torch.long)


class LSTMTagger(nn.Module):
    def __init__(self, embedding_dim, hidden_dim, vocab_size, tagset_size):
        super().__init__()
        self.hidden_dim = hidden_dim
        self.word_embeddings = nn.Embedding(vocab_size, embedding_dim)
        self.lstm = nn.LSTM(embedding_dim, hidden_dim)
        self.hidden2tag = nn.Linear(hidden_dim, tagset_size)
        self.hidden = self.init_hidden()

    def init_hidden(self):
        return (torch.zeros(1, 1, self.hidden_dim), torch.zeros(1, 1, self.hidden_dim))

    def forward(self, sentence):
        embeds = self.word_embeddings(sentence)
        lstm_out, self.hidden = self.lstm(embeds.view(len(sentence), 1, -1), self.hidden)
        return F.log_softmax(self.hidden2tag(lstm_out.view(len(sentence), -1)), dim=1)


model = LSTMTagger(6, 6, len(word_to_ix), len(tag_to_ix))
loss_function = nn.NLLLoss()
optimizer = optim.SGD(model.parameters(), lr=0.1)
losses = []
for _ in range(15):
    for sentence, tags in training_data:
        model.zero_grad()
        model.hidden = model.init_hidden()
        loss = loss_function(
            model(prepare_sequence(sentence, word_to_ix)), prepare_sequence(tags, tag_to_ix)
        )
        loss.backward()
        optimizer.step()
    losses.append(loss.item())

predicted = []
with torch.no_grad():
    for sentence, _ in training_data:
        model.hidden = model.init_hidden()
        idx = model(prepare_sequence(sentence, word_to_ix)).argmax(1)
        predicted.append([ix_to_tag[i] for i in idx.tolist()])
print("RESULT " + json.dumps({"losses": losses, "tags": predicted}))
