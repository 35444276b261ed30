"""The save/reload steps of ../legacy/main.py, modernised by hand."""

import json

import torch
import torch.nn as nn

input_size = 20
hidden_size = 16
num_classes = 4
learning_rate = 0.01

torch.manual_seed(9)
images = torch.randn(64, input_size)
labels = images[:, :num_classes].argmax(1)


class Net(nn.Module):
    def __init__(self, input_size, hidden_size, num_classes):
        super().__init__()
        self.fc1 = nn.Linear(input_size, hidden_size)
        self.relu = nn.ReLU()
        self.fc2 = nn.Linear(hidden_size, num_classes)

    def forward(self, x):
        return self.fc2(self.relu(self.fc1(x)))


net = Net(input_size, hidden_size, num_classes)
criterion = nn.CrossEntropyLoss()
optimizer = torch.optim.Adam(net.parameters(), lr=learning_rate)

losses = []
for epoch in range(5):
    for i in range(4):
        x = images[i * 16 : (i + 1) * 16]
        y = labels[i * 16 : (i + 1) * 16]
        optimizer.zero_grad()
        loss = criterion(net(x), y)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    print(f"Epoch [{epoch + 1}/5], Loss: {loss.item():.4f}")

torch.save(net, "model.pkl")
model = torch.load("model.pkl", weights_only=False)  # our own file: a whole pickled model

torch.save(net.state_dict(), "params.pkl")
net.load_state_dict(torch.load("params.pkl"))

with torch.no_grad():
    predicted = model(images).argmax(1)
correct = (predicted == labels).sum().item()
print(f"Accuracy of the reloaded model: {100 * correct / len(labels):.0f} %")
print("RESULT " + json.dumps({"losses": losses, "correct": int(correct)}))
