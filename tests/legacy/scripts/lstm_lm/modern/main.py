"""The LSTM language model of ../legacy/main.py, modernised by hand."""

import json

import torch
import torch.nn as nn

torch.manual_seed(7)
ntoken, ninp, nhid, bptt, bsz = 20, 8, 12, 5, 4


def repackage_hidden(h):
    if isinstance(h, torch.Tensor):
        return h.detach()
    return tuple(repackage_hidden(v) for v in h)


class RNNModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder = nn.Embedding(ntoken, ninp)
        self.rnn = nn.LSTM(ninp, nhid)
        self.decoder = nn.Linear(nhid, ntoken)

    def forward(self, input, hidden, mask):
        output, hidden = self.rnn(self.encoder(input), hidden)
        output = output.transpose(0, 1) * mask.unsqueeze(2)
        decoded = self.decoder(output.reshape(-1, nhid))
        return decoded.view(mask.size(0), mask.size(1), ntoken), hidden

    def init_hidden(self):
        weight = next(self.parameters())
        return (weight.new_zeros(1, bsz, nhid), weight.new_zeros(1, bsz, nhid))


corpus = torch.empty(bptt * 6 + 1, bsz, dtype=torch.long).random_(0, ntoken)
lengths = torch.empty(bsz, dtype=torch.long).random_(2, bptt + 1)
model = RNNModel()
criterion = nn.CrossEntropyLoss()
optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
hidden = model.init_hidden()
total_loss, losses = 0.0, []
for i in range(0, bptt * 6, bptt):
    data = corpus[i : i + bptt]
    targets = corpus[i + 1 : i + 1 + bptt].t().contiguous()
    mask = (torch.arange(bptt).unsqueeze(0) < lengths.unsqueeze(1)).float()
    hidden = repackage_hidden(hidden)
    model.zero_grad()
    output, hidden = model(data, hidden, mask)
    loss = criterion(output.view(-1, ntoken), targets.view(-1))
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 0.25)
    optimizer.step()
    total_loss += loss.item()
    losses.append(loss.item())
print(f"average loss {total_loss / 6:.4f}")
print("RESULT " + json.dumps({"losses": losses, "average": total_loss / 6}))
