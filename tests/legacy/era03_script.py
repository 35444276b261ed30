"""A PyTorch 0.3 era script: word language model and Hogwild idioms, run unedited under
`safetorch run` (tests/legacy/test_legacy_zero_dim.py); prints JSON results."""

import json

import torch
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F
from torch.autograd import Variable


def repackage_hidden(h):
    """Wraps hidden states in new Variables, to detach them from their history."""
    if type(h) == Variable:  # noqa: E721
        return Variable(h.data)
    else:
        return tuple(repackage_hidden(v) for v in h)


class Net(nn.Module):
    def __init__(self):
        super(Net, self).__init__()  # noqa: UP008
        self.conv1 = nn.Conv2d(1, 4, kernel_size=5)
        self.fc = nn.Linear(4 * 12 * 12, 10)

    def forward(self, x):
        x = F.relu(F.max_pool2d(self.conv1(x), 2))
        return F.log_softmax(self.fc(x.view(-1, 4 * 12 * 12)), 1)


def train(rank, model, threads):
    torch.manual_seed(rank)
    threads.put(torch.get_num_threads())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(2):
        data = Variable(torch.randn(16, 1, 28, 28))
        target = Variable(torch.LongTensor(16).random_(0, 10))
        optimizer.zero_grad()
        loss = F.nll_loss(model(data), target)
        loss.backward()
        optimizer.step()


if __name__ == "__main__":
    torch.manual_seed(0)
    idx2word = {i: w for i, w in enumerate(["<unk>", "the", "cat", "sat", "on", "mat"])}
    rnn, decoder = nn.LSTM(4, 4), nn.Linear(4, len(idx2word))
    hidden = (Variable(torch.zeros(1, 1, 4)), Variable(torch.zeros(1, 1, 4)))
    log, words = [], []
    for step in range(3):
        output, hidden = rnn(Variable(torch.randn(1, 1, 4)), hidden)
        hidden = repackage_hidden(hidden)
        scores = decoder(output.view(1, -1))
        loss = F.cross_entropy(scores, Variable(torch.LongTensor([1])))
        log.append("| step {:3d} | loss {:5.2f}".format(step, loss.data[0]))  # noqa: UP032
        top = decoder(Variable(output.data, volatile=True).view(-1, 4)).view(-1).max(0)[1]
        words.append(idx2word[top.data[0]])

    model = Net()
    model.share_memory()
    model(Variable(torch.randn(64, 1, 28, 28)))  # the parent's OpenMP threads start here
    threads = mp.Queue()
    processes = []
    for rank in range(2):
        p = mp.Process(target=train, args=(rank, model, threads))
        p.start()
        processes.append(p)
    for p in processes:
        p.join(120)
    print(
        json.dumps(
            {
                "log": log,
                "words": words,
                "loss": loss.data[0],
                "hidden_is_tensor": [type(h).__name__ for h in hidden],
                "exitcodes": [p.exitcode for p in processes],
                "child_threads": [threads.get(timeout=10) for _ in processes],
            }
        )
    )
