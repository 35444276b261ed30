"""REINFORCE of ../legacy/reinforce.py, modernised by hand."""

import json

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim
from torch.distributions import Categorical

torch.manual_seed(11)
MOVES = {0: -1, 1: 1}


class Corridor:
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
        super().__init__()
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
    probs = policy(torch.from_numpy(state).float().unsqueeze(0))
    m = Categorical(probs)
    action = m.sample()
    policy.saved_log_probs.append(m.log_prob(action))
    return action.item()


def finish_episode():
    R, rewards = 0.0, []
    for r in policy.rewards[::-1]:
        R = r + 0.99 * R
        rewards.insert(0, R)
    rewards = torch.tensor(rewards)
    rewards = (rewards - rewards.mean()) / (rewards.std() + eps)
    policy_loss = torch.cat([-lp * r for lp, r in zip(policy.saved_log_probs, rewards)]).sum()
    optimizer.zero_grad()
    policy_loss.backward()
    optimizer.step()
    del policy.rewards[:]
    del policy.saved_log_probs[:]
    return policy_loss.item()


env = Corridor()
losses, lengths = [], []
for _ in range(8):
    state = env.reset()
    for t in range(12):  # noqa: B007  (read after the loop)
        state, reward, done = env.step(select_action(state))
        policy.rewards.append(reward)
        if done:
            break
    lengths.append(t + 1)
    losses.append(finish_episode())
print("RESULT " + json.dumps({"losses": losses, "lengths": lengths}))
