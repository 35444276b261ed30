"""The name classifier of ../legacy/train.py, modernised by hand."""

import json
import random

import torch
import torch.nn as nn
from data import all_categories, category_lines, lineToTensor, n_categories, n_letters
from model import RNN

n_hidden = 32
n_epochs = 60
print_every = 20
learning_rate = 0.005

random.seed(2)
torch.manual_seed(2)


def categoryFromOutput(output):
    top_n, top_i = output.topk(1)
    category_i = top_i[0].item()
    return all_categories[category_i], category_i


def randomChoice(items):
    return items[random.randint(0, len(items) - 1)]


def randomTrainingPair():
    category = randomChoice(all_categories)
    line = randomChoice(category_lines[category])
    category_tensor = torch.tensor([all_categories.index(category)], dtype=torch.long)
    return category, line, category_tensor, lineToTensor(line)


rnn = RNN(n_letters, n_hidden, n_categories)
criterion = nn.NLLLoss()


def train(category_tensor, line_tensor):
    rnn.zero_grad()
    hidden = rnn.initHidden()
    for i in range(line_tensor.size()[0]):
        output, hidden = rnn(line_tensor[i], hidden)
    loss = criterion(output, category_tensor)
    loss.backward()
    for p in rnn.parameters():
        p.data.add_(p.grad, alpha=-learning_rate)
    return output, loss.item()


current_loss = 0
losses = []
for epoch in range(1, n_epochs + 1):
    category, line, category_tensor, line_tensor = randomTrainingPair()
    output, loss = train(category_tensor, line_tensor)
    current_loss += loss
    losses.append(loss)
    if epoch % print_every == 0:
        guess, guess_i = categoryFromOutput(output)
        print(f"{epoch} {loss:.4f} {line} / {guess} {'ok' if guess == category else 'wrong'}")

torch.save(rnn, "char-rnn-classification.pt")
print("RESULT " + json.dumps({"losses": losses, "mean_loss": current_loss / n_epochs}))
