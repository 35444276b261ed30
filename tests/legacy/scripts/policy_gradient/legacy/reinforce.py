# ruff: noqa
# fmt: off
"""REINFORCE on a toy corridor, PyTorch 0.3 style (legacy idioms, unedited by design).

Re-creates, in our own words, the idioms of pytorch/examples ``reinforcement_learning/
reinforce.py`` as of early 2018 (BSD-3-Clause): ``probs = policy(Variable(state))``, a
``Categorical`` sample returned as ``action.data[0]`` (0.3: a Python int) and used as a key
of the environment's move table, ``policy.saved_log_probs``, rewards normalised with
``torch.Tensor(rewards)``, ``torch.cat(policy_loss).sum()``. A five-cell corridor stands in
for gym's CartPole.
"""
import json

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim
from torch.autograd import Variable
from torch.distributions import Categorical

torch.manual_seed(11)
MOVES = {0: -1, 1: 1}


class Corridor(object):
    def reset(self):
        self.pos = 0
        return self.state()

    def state(self):
        s = np.zeros(5, dtype=np.float32)
        s[self.pos] = 1
        return s

    def step(self, action):
        self.pos = min(max(self.pos + MOVES[action], 0), 4)
        done = self.pos == 4
        return self.state(), (1.0 if done else -0.1), done


class Policy(nn.Module):
    def __init__(self):
        super(Policy, self).__init__()
        self.affine1 = nn.Linear(5, 16)
        self.affine2 = nn.Linear(16, 2)
        self.saved_log_probs = []
        self.rewards = []

    def forward(self, x):
        return F.softmax(self.affine2(F.relu(self.affine1(x))), dim=1)


policy = Policy()
optimizer = optim.Adam(policy.parameters(), lr=1e-2)
eps = np.finfo(np.float32).eps.item()


def select_action(state):
    state = torch.from_numpy(state).float().unsqueeze(0)
    probs = policy(Variable(state))
    m = Categorical(probs)
    action = m.sample()
    policy.saved_log_probs.append(m.log_prob(action))
    return action.data[0]


def finish_episode():
    R, rewards, policy_loss = 0, [], []
    for r in policy.rewards[::-1]:
        R = r + 0.99 * R
        rewards.insert(0, R)
    rewards = torch.Tensor(rewards)
    rewards = (rewards - rewards.mean()) / (rewards.std() + eps)
    for log_prob, reward in zip(policy.saved_log_probs, rewards):
        policy_loss.append(-log_prob * reward)
    optimizer.zero_grad()
    policy_loss = torch.cat(policy_loss).sum()
    policy_loss.backward()
    optimizer.step()
    del policy.rewards[:]
    del policy.saved_log_probs[:]
    return policy_loss.data[0]


env = Corridor()
losses, lengths = [], []
for i_episode in range(8):
    state = env.reset()
    for t in range(12):
        state, reward, done = env.step(select_action(state))
        policy.rewards.append(reward)
        if done:
            break
    lengths.append(t + 1)
    losses.append(finish_episode())
print('RESULT ' + json.dumps({'losses': losses, 'lengths': lengths}))
