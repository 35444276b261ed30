"""Samples words from the model main.py saved (modernised by hand)."""

import argparse
import json

import data
import torch

parser = argparse.ArgumentParser(description="PyTorch Language Model")
parser.add_argument("--data", type=str, default="./data")
parser.add_argument("--checkpoint", type=str, default="./model.pt")
parser.add_argument("--words", type=int, default=30)
parser.add_argument("--seed", type=int, default=1111)
parser.add_argument("--temperature", type=float, default=1.0)
args = parser.parse_args()

torch.manual_seed(args.seed)

with open(args.checkpoint, "rb") as f:
    model = torch.load(f, weights_only=False)  # our own file: a whole pickled model
model.eval()
model.cpu()

corpus = data.Corpus(args.data)
ntokens = len(corpus.dictionary)
hidden = model.init_hidden(1)
input = torch.randint(ntokens, (1, 1), dtype=torch.long)

words = []
with torch.no_grad():
    for _ in range(args.words):
        output, hidden = model(input, hidden)
        word_weights = output.squeeze().div(args.temperature).exp().cpu()
        word_idx = torch.multinomial(word_weights, 1)[0]
        input.fill_(word_idx)
        words.append(corpus.dictionary.idx2word[word_idx])

print(" ".join(words))
print("RESULT " + json.dumps({"words": words}))
