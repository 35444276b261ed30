"""The word language model of ../legacy/main.py, modernised by hand (torch >= 1.0)."""

import argparse
import json
import math

import data
import model
import torch
import torch.nn as nn

parser = argparse.ArgumentParser(description="PyTorch RNN/LSTM Language Model")
parser.add_argument("--data", type=str, default="./data")
parser.add_argument("--model", type=str, default="LSTM")
parser.add_argument("--emsize", type=int, default=16)
parser.add_argument("--nhid", type=int, default=16)
parser.add_argument("--nlayers", type=int, default=2)
parser.add_argument("--lr", type=float, default=20)
parser.add_argument("--clip", type=float, default=0.25)
parser.add_argument("--epochs", type=int, default=2)
parser.add_argument("--batch_size", type=int, default=4)
parser.add_argument("--bptt", type=int, default=10)
parser.add_argument("--dropout", type=float, default=0.2)
parser.add_argument("--seed", type=int, default=1111)
parser.add_argument("--log-interval", type=int, default=10)
parser.add_argument("--save", type=str, default="model.pt")
args = parser.parse_args()

torch.manual_seed(args.seed)
corpus = data.Corpus(args.data)


def batchify(data, bsz):
    nbatch = data.size(0) // bsz
    data = data.narrow(0, 0, nbatch * bsz)
    return data.view(bsz, -1).t().contiguous()


eval_batch_size = 4
train_data = batchify(corpus.train, args.batch_size)
val_data = batchify(corpus.valid, eval_batch_size)
test_data = batchify(corpus.test, eval_batch_size)

ntokens = len(corpus.dictionary)
model = model.RNNModel(args.model, ntokens, args.emsize, args.nhid, args.nlayers, args.dropout)
criterion = nn.CrossEntropyLoss()


def repackage_hidden(h):
    """Detaches hidden states from their history."""
    if isinstance(h, torch.Tensor):
        return h.detach()
    return tuple(repackage_hidden(v) for v in h)


def get_batch(source, i):
    seq_len = min(args.bptt, len(source) - 1 - i)
    data = source[i : i + seq_len]
    target = source[i + 1 : i + 1 + seq_len].view(-1)
    return data, target


def evaluate(data_source):
    model.eval()
    total_loss = 0.0
    hidden = model.init_hidden(eval_batch_size)
    with torch.no_grad():
        for i in range(0, data_source.size(0) - 1, args.bptt):
            data, targets = get_batch(data_source, i)
            output, hidden = model(data, hidden)
            total_loss += len(data) * criterion(output.view(-1, ntokens), targets).item()
            hidden = repackage_hidden(hidden)
    return total_loss / len(data_source)


history = []


def train():
    model.train()
    total_loss = 0.0
    hidden = model.init_hidden(args.batch_size)
    for batch, i in enumerate(range(0, train_data.size(0) - 1, args.bptt)):
        data, targets = get_batch(train_data, i)
        hidden = repackage_hidden(hidden)
        model.zero_grad()
        output, hidden = model(data, hidden)
        loss = criterion(output.view(-1, ntokens), targets)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
        for p in model.parameters():
            p.data.add_(p.grad, alpha=-lr)
        total_loss += loss.item()
        history.append(loss.item())
        if batch % args.log_interval == 0 and batch > 0:
            cur_loss = total_loss / args.log_interval
            print(
                f"| epoch {epoch:3d} | {batch:5d} batches | lr {lr:02.2f} | "
                f"loss {cur_loss:5.2f} | ppl {math.exp(cur_loss):8.2f}"
            )
            total_loss = 0


lr = args.lr
best_val_loss = None
val_losses = []
for epoch in range(1, args.epochs + 1):
    train()
    val_loss = evaluate(val_data)
    val_losses.append(val_loss)
    print(f"| end of epoch {epoch:3d} | valid loss {val_loss:5.2f}")
    if not best_val_loss or val_loss < best_val_loss:
        with open(args.save, "wb") as f:
            torch.save(model, f)
        best_val_loss = val_loss
    else:
        lr /= 4.0

with open(args.save, "rb") as f:
    model = torch.load(f, weights_only=False)  # our own file: a whole pickled model

test_loss = evaluate(test_data)
print(f"| End of training | test loss {test_loss:5.2f}")
print("RESULT " + json.dumps({"losses": history, "val_losses": val_losses, "test_loss": test_loss}))
