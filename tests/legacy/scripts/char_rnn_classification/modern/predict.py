"""Predicts the language of names with the RNN train.py saved whole (modernised by hand)."""

import json
import sys

import torch
from data import all_categories, lineToTensor

rnn = torch.load("char-rnn-classification.pt", weights_only=False)  # our own whole model


def evaluate(line_tensor):
    hidden = rnn.initHidden()
    for i in range(line_tensor.size()[0]):
        output, hidden = rnn(line_tensor[i], hidden)
    return output


def predict(line, n_predictions=2):
    with torch.no_grad():
        output = evaluate(lineToTensor(line))
    topv, topi = output.topk(n_predictions, 1, True)
    predictions = []
    for i in range(n_predictions):
        value = topv[0][i].item()
        category_index = topi[0][i].item()
        predictions.append([f"{value:.4f}", all_categories[category_index]])
    return predictions


if __name__ == "__main__":
    names = sys.argv[1:] or ["Aldrael", "Grakbor", "Cessami"]
    print("RESULT " + json.dumps({"predictions": [predict(name) for name in names]}))
