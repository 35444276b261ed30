"""The sine-wave predictor of ../legacy/train.py, modernised by hand."""

import json

import numpy as np
import torch
import torch.nn as nn
import torch.optim as optim


class Sequence(nn.Module):
    def __init__(self):
        super().__init__()
        self.lstm1 = nn.LSTMCell(1, 16)
        self.lstm2 = nn.LSTMCell(16, 16)
        self.linear = nn.Linear(16, 1)

    def forward(self, input, future=0):
        outputs = []
        h_t = torch.zeros(input.size(0), 16, dtype=torch.double)
        c_t = torch.zeros(input.size(0), 16, dtype=torch.double)
        h_t2 = torch.zeros(input.size(0), 16, dtype=torch.double)
        c_t2 = torch.zeros(input.size(0), 16, dtype=torch.double)
        for input_t in input.split(1, dim=1):
            h_t, c_t = self.lstm1(input_t, (h_t, c_t))
            h_t2, c_t2 = self.lstm2(h_t, (h_t2, c_t2))
            output = self.linear(h_t2)
            outputs += [output]
        for _ in range(future):
            h_t, c_t = self.lstm1(output, (h_t, c_t))
            h_t2, c_t2 = self.lstm2(h_t, (h_t2, c_t2))
            output = self.linear(h_t2)
            outputs += [output]
        return torch.cat(outputs, dim=1)


if __name__ == "__main__":
    np.random.seed(0)
    torch.manual_seed(0)
    data = np.load("traindata.npy")
    input = torch.from_numpy(data[3:, :-1])
    target = torch.from_numpy(data[3:, 1:])
    test_input = torch.from_numpy(data[:3, :-1])
    test_target = torch.from_numpy(data[:3, 1:])
    seq = Sequence().double()
    criterion = nn.MSELoss()
    optimizer = optim.LBFGS(seq.parameters(), lr=0.5, max_iter=5)
    losses = []
    test_losses = []
    for i in range(2):
        print("STEP: ", i)

        def closure():
            optimizer.zero_grad()
            out = seq(input)
            loss = criterion(out, target)
            print("loss:", loss.item())
            losses.append(loss.item())
            loss.backward()
            return loss

        optimizer.step(closure)
        with torch.no_grad():
            future = 20
            pred = seq(test_input, future=future)
            loss = criterion(pred[:, :-future], test_target)
            print("test loss:", loss.item())
            test_losses.append(loss.item())
            y = pred.numpy()
    print(
        "RESULT "
        + json.dumps(
            {"losses": losses, "test_losses": test_losses, "future_mean": float(y[:, -20:].mean())}
        )
    )
