"""Writes a small synthetic corpus (data/train.txt, valid.txt, test.txt) for the word
language model: sentences from a tiny grammar, seeded, so every run reads the same text."""

import os
import random

random.seed(0)
subjects = ["the cat", "a dog", "the bird", "my friend", "the teacher"]
verbs = ["sees", "likes", "finds", "follows", "hears"]
objects = ["the ball", "a tree", "the house", "some food", "the river"]
os.makedirs("data", exist_ok=True)
for name, lines in (("train", 120), ("valid", 30), ("test", 30)):
    with open(os.path.join("data", name + ".txt"), "w") as f:
        for _ in range(lines):
            f.write(
                " ".join([random.choice(subjects), random.choice(verbs), random.choice(objects)])
                + " .\n"
            )
