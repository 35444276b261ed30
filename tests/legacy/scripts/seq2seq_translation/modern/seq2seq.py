"""The encoder-decoder of ../legacy/seq2seq.py, modernised by hand."""

import json
import random

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import optim

SOS_token = 0
EOS_token = 1


class Lang:
    def __init__(self, name):
        self.name = name
        self.word2index = {}
        self.word2count = {}
        self.index2word = {0: "SOS", 1: "EOS"}
        self.n_words = 2

    def addSentence(self, sentence):
        for word in sentence.split(" "):
            self.addWord(word)

    def addWord(self, word):
        if word not in self.word2index:
            self.word2index[word] = self.n_words
            self.word2count[word] = 1
            self.index2word[self.n_words] = word
            self.n_words += 1
        else:
            self.word2count[word] += 1


random.seed(4)
torch.manual_seed(4)
vocab = ["red", "blue", "cat", "dog", "runs", "sleeps", "big", "small"]
toy = {w: w[::-1] + "o" for w in vocab}
pairs = []
for _ in range(20):
    words = [random.choice(vocab) for _ in range(3)]
    pairs.append([" ".join(words), " ".join(toy[w] for w in reversed(words))])
input_lang, output_lang = Lang("eng"), Lang("toy")
for src, tgt in pairs:
    input_lang.addSentence(src)
    output_lang.addSentence(tgt)


class EncoderRNN(nn.Module):
    def __init__(self, input_size, hidden_size):
        super().__init__()
        self.hidden_size = hidden_size
        self.embedding = nn.Embedding(input_size, hidden_size)
        self.gru = nn.GRU(hidden_size, hidden_size)

    def forward(self, input, hidden):
        embedded = self.embedding(input).view(1, 1, -1)
        return self.gru(embedded, hidden)

    def initHidden(self):
        return torch.zeros(1, 1, self.hidden_size)


class DecoderRNN(nn.Module):
    def __init__(self, hidden_size, output_size):
        super().__init__()
        self.hidden_size = hidden_size
        self.embedding = nn.Embedding(output_size, hidden_size)
        self.gru = nn.GRU(hidden_size, hidden_size)
        self.out = nn.Linear(hidden_size, output_size)
        self.softmax = nn.LogSoftmax(dim=1)

    def forward(self, input, hidden):
        output = F.relu(self.embedding(input).view(1, 1, -1))
        output, hidden = self.gru(output, hidden)
        return self.softmax(self.out(output[0])), hidden


def tensorFromSentence(lang, sentence):
    indexes = [lang.word2index[word] for word in sentence.split(" ")]
    indexes.append(EOS_token)
    return torch.tensor(indexes, dtype=torch.long).view(-1, 1)


teacher_forcing_ratio = 0.5


def train(
    input_tensor, target_tensor, encoder, decoder, encoder_optimizer, decoder_optimizer, criterion
):
    encoder_hidden = encoder.initHidden()
    encoder_optimizer.zero_grad()
    decoder_optimizer.zero_grad()
    target_length = target_tensor.size(0)
    loss = 0
    for ei in range(input_tensor.size(0)):
        encoder_output, encoder_hidden = encoder(input_tensor[ei], encoder_hidden)
    decoder_input = torch.tensor([[SOS_token]])
    decoder_hidden = encoder_hidden
    use_teacher_forcing = random.random() < teacher_forcing_ratio
    for di in range(target_length):
        decoder_output, decoder_hidden = decoder(decoder_input, decoder_hidden)
        loss += criterion(decoder_output, target_tensor[di])
        if use_teacher_forcing:
            decoder_input = target_tensor[di]
        else:
            topv, topi = decoder_output.topk(1)
            decoder_input = topi.detach()
    loss.backward()
    encoder_optimizer.step()
    decoder_optimizer.step()
    return loss.item() / target_length


def evaluate(encoder, decoder, sentence, max_length=10):
    with torch.no_grad():
        input_tensor = tensorFromSentence(input_lang, sentence)
        encoder_hidden = encoder.initHidden()
        for ei in range(input_tensor.size(0)):
            encoder_output, encoder_hidden = encoder(input_tensor[ei], encoder_hidden)
        decoder_input = torch.tensor([[SOS_token]])
        decoder_hidden = encoder_hidden
        decoded_words = []
        for _ in range(max_length):
            decoder_output, decoder_hidden = decoder(decoder_input, decoder_hidden)
            topv, topi = decoder_output.topk(1)
            ni = topi.item()
            if ni == EOS_token:
                decoded_words.append("<EOS>")
                break
            decoded_words.append(output_lang.index2word[ni])
            decoder_input = torch.tensor([[ni]])
    return decoded_words


hidden_size = 32
encoder = EncoderRNN(input_lang.n_words, hidden_size)
decoder = DecoderRNN(hidden_size, output_lang.n_words)
encoder_optimizer = optim.SGD(encoder.parameters(), lr=0.05)
decoder_optimizer = optim.SGD(decoder.parameters(), lr=0.05)
criterion = nn.NLLLoss()

losses = []
for iter in range(1, 41):
    pair = random.choice(pairs)
    loss = train(
        tensorFromSentence(input_lang, pair[0]),
        tensorFromSentence(output_lang, pair[1]),
        encoder,
        decoder,
        encoder_optimizer,
        decoder_optimizer,
        criterion,
    )
    losses.append(loss)
    if iter % 10 == 0:
        print(f"{iter} {loss:.4f}")

translations = [evaluate(encoder, decoder, pair[0]) for pair in pairs[:3]]
print("RESULT " + json.dumps({"losses": losses, "translations": translations}))
