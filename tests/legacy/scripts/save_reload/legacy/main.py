# ruff: noqa
# fmt: off
"""Save and reload a whole model, PyTorch 0.2/0.3 tutorial style (legacy idioms, unedited by
design).

Re-creates, in our own words, the "save and load the model" steps of
yunjey/pytorch-tutorial ``tutorials/01-basics`` as of September 2017 (MIT): a small
feed-forward net trained with ``Variable`` inputs and ``loss.data[0]``, then saved two
ways, ``torch.save(model, 'model.pkl')`` (the entire model) reloaded with
``torch.load('model.pkl')``, and ``torch.save(model.state_dict(), 'params.pkl')`` reloaded
with ``load_state_dict(torch.load('params.pkl'))``. Random data stand in for MNIST.
"""
import json

import torch
import torch.nn as nn
from torch.autograd import Variable

input_size = 20
hidden_size = 16
num_classes = 4
learning_rate = 0.01

torch.manual_seed(9)
images = torch.randn(64, input_size)
labels = (images[:, :num_classes]).max(1)[1]


class Net(nn.Module):
    def __init__(self, input_size, hidden_size, num_classes):
        super(Net, self).__init__()
        self.fc1 = nn.Linear(input_size, hidden_size)
        self.relu = nn.ReLU()
        self.fc2 = nn.Linear(hidden_size, num_classes)

    def forward(self, x):
        out = self.fc1(x)
        out = self.relu(out)
        out = self.fc2(out)
        return out


net = Net(input_size, hidden_size, num_classes)
criterion = nn.CrossEntropyLoss()
optimizer = torch.optim.Adam(net.parameters(), lr=learning_rate)

losses = []
for epoch in range(5):
    for i in range(4):
        x = Variable(images[i * 16:(i + 1) * 16])
        y = Variable(labels[i * 16:(i + 1) * 16])
        optimizer.zero_grad()
        outputs = net(x)
        loss = criterion(outputs, y)
        loss.backward()
        optimizer.step()
        losses.append(loss.data[0])
    print('Epoch [%d/5], Loss: %.4f' % (epoch + 1, loss.data[0]))

# Save and load the entire model.
torch.save(net, 'model.pkl')
model = torch.load('model.pkl')

# Save and load only the model parameters (recommended).
torch.save(net.state_dict(), 'params.pkl')
net.load_state_dict(torch.load('params.pkl'))

outputs = model(Variable(images))
_, predicted = torch.max(outputs.data, 1)
correct = (predicted == labels).sum()
print('Accuracy of the reloaded model: %d %%' % (100 * correct / len(labels)))
print('RESULT ' + json.dumps({'losses': losses, 'correct': int(correct)}))
