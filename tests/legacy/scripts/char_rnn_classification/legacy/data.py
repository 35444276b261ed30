# ruff: noqa
# fmt: off
import random
import string

import torch

all_letters = string.ascii_letters + " .,;'-"
n_letters = len(all_letters)

# Three made-up "languages" with their own syllables stand in for the names files.
_syllables = {
    'Aldran': ['al', 'dra', 'on', 'ith', 'el'],
    'Boruk': ['bor', 'uk', 'grak', 'tho', 'zu'],
    'Cenni': ['ce', 'ni', 'lla', 'ssa', 'mi'],
}
random.seed(1)
category_lines = {}
all_categories = []
for category, parts in sorted(_syllables.items()):
    all_categories.append(category)
    category_lines[category] = [
        ''.join(random.choice(parts) for _ in range(random.randint(2, 3))).capitalize()
        for _ in range(20)
    ]
n_categories = len(all_categories)


def letterToIndex(letter):
    return all_letters.find(letter)


def lineToTensor(line):
    tensor = torch.zeros(len(line), 1, n_letters)
    for li, letter in enumerate(line):
        tensor[li][0][letterToIndex(letter)] = 1
    return tensor
