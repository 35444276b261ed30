# ruff: noqa
# fmt: off
"""A GRU encoder-decoder translating toy sentences, PyTorch 0.2/0.3 style (legacy idioms,
unedited by design).

Re-creates, in our own words, the idioms of spro/practical-pytorch
``seq2seq-translation`` (and the PyTorch tutorial made from it) as of September 2017
(MIT): a ``Lang`` class with ``word2index``/``index2word`` dicts, ``loss.data[0] /
target_length``, and greedy decoding with ``topv, topi = decoder_output.data.topk(1)``,
``ni = topi[0][0]`` (a Python number in torch 0.3, a 0-dim tensor since 0.4) used as
``output_lang.index2word[ni]``: a dict lookup ``safetorch run`` cannot shim. Toy pairs
(a sentence and the same words in a made-up language, reversed) stand in for eng-fra.
"""
import json
import random

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import optim
from torch.autograd import Variable

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
        for word in sentence.split(' '):
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
vocab = ['red', 'blue', 'cat', 'dog', 'runs', 'sleeps', 'big', 'small']
toy = {w: w[::-1] + 'o' for w in vocab}
pairs = []
for _ in range(20):
    words = [random.choice(vocab) for _ in range(3)]
    pairs.append([' '.join(words), ' '.join(toy[w] for w in reversed(words))])
input_lang, output_lang = Lang('eng'), Lang('toy')
for src, tgt in pairs:
    input_lang.addSentence(src)
    output_lang.addSentence(tgt)


class EncoderRNN(nn.Module):
    def __init__(self, input_size, hidden_size):
        super(EncoderRNN, self).__init__()
        self.hidden_size = hidden_size
        self.embedding = nn.Embedding(input_size, hidden_size)
        self.gru = nn.GRU(hidden_size, hidden_size)

    def forward(self, input, hidden):
        embedded = self.embedding(input).view(1, 1, -1)
        output, hidden = self.gru(embedded, hidden)
        return output, hidden

    def initHidden(self):
        return Variable(torch.zeros(1, 1, self.hidden_size))


class DecoderRNN(nn.Module):
    def __init__(self, hidden_size, output_size):
        super(DecoderRNN, self).__init__()
        self.hidden_size = hidden_size
        self.embedding = nn.Embedding(output_size, hidden_size)
        self.gru = nn.GRU(hidden_size, hidden_size)
        self.out = nn.Linear(hidden_size, output_size)
        self.softmax = nn.LogSoftmax()

    def forward(self, input, hidden):
        output = F.relu(self.embedding(input).view(1, 1, -1))
        output, hidden = self.gru(output, hidden)
        output = self.softmax(self.out(output[0]))
        return output, hidden


def variableFromSentence(lang, sentence):
    indexes = [lang.word2index[word] for word in sentence.split(' ')]
    indexes.append(EOS_token)
    return Variable(torch.LongTensor(indexes).view(-1, 1))


teacher_forcing_ratio = 0.5


def train(input_variable, target_variable, encoder, decoder, encoder_optimizer,
          decoder_optimizer, criterion):
    encoder_hidden = encoder.initHidden()
    encoder_optimizer.zero_grad()
    decoder_optimizer.zero_grad()
    input_length = input_variable.size()[0]
    target_length = target_variable.size()[0]
    loss = 0
    for ei in range(input_length):
        encoder_output, encoder_hidden = encoder(input_variable[ei], encoder_hidden)
    decoder_input = Variable(torch.LongTensor([[SOS_token]]))
    decoder_hidden = encoder_hidden
    use_teacher_forcing = random.random() < teacher_forcing_ratio
    for di in range(target_length):
        decoder_output, decoder_hidden = decoder(decoder_input, decoder_hidden)
        loss += criterion(decoder_output, target_variable[di])
        if use_teacher_forcing:
            decoder_input = target_variable[di]
        else:
            topv, topi = decoder_output.data.topk(1)
            decoder_input = Variable(topi)
    loss.backward()
    encoder_optimizer.step()
    decoder_optimizer.step()
    return loss.data[0] / target_length


def evaluate(encoder, decoder, sentence, max_length=10):
    input_variable = variableFromSentence(input_lang, sentence)
    encoder_hidden = encoder.initHidden()
    for ei in range(input_variable.size()[0]):
        encoder_output, encoder_hidden = encoder(input_variable[ei], encoder_hidden)
    decoder_input = Variable(torch.LongTensor([[SOS_token]]))
    decoder_hidden = encoder_hidden
    decoded_words = []
    for di in range(max_length):
        decoder_output, decoder_hidden = decoder(decoder_input, decoder_hidden)
        topv, topi = decoder_output.data.topk(1)
        ni = topi[0][0]
        if ni == EOS_token:
            decoded_words.append('<EOS>')
            break
        else:
            decoded_words.append(output_lang.index2word[ni])
        decoder_input = Variable(torch.LongTensor([[ni]]))
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
    loss = train(variableFromSentence(input_lang, pair[0]),
                 variableFromSentence(output_lang, pair[1]),
                 encoder, decoder, encoder_optimizer, decoder_optimizer, criterion)
    losses.append(loss)
    if iter % 10 == 0:
        print('%d %.4f' % (iter, loss))

translations = [evaluate(encoder, decoder, pair[0]) for pair in pairs[:3]]
print('RESULT ' + json.dumps({'losses': losses, 'translations': translations}))
