"""The beam of ../legacy/beam.py, modernised by hand: floor division of indices."""

import torch

BOS = 0


class Beam:
    def __init__(self, size):
        self.size = size
        self.scores = torch.zeros(size)
        self.prev_ks = []
        self.next_ys = [torch.full((size,), BOS, dtype=torch.long)]

    def get_current_state(self):
        return self.next_ys[-1]

    def advance(self, word_lk):
        num_words = word_lk.size(1)
        if self.prev_ks:
            beam_lk = word_lk + self.scores.unsqueeze(1).expand_as(word_lk)
        else:
            beam_lk = word_lk[0]
        best_scores, best_scores_id = beam_lk.reshape(-1).topk(self.size, 0, True, True)
        self.scores = best_scores
        prev_k = torch.div(best_scores_id, num_words, rounding_mode="floor")
        self.prev_ks.append(prev_k)
        self.next_ys.append(best_scores_id - prev_k * num_words)

    def get_hypothesis(self, k):
        hyp = []
        for j in range(len(self.prev_ks) - 1, -1, -1):
            hyp.append(self.next_ys[j + 1][k])
            k = self.prev_ks[j][k]
        return [int(w) for w in hyp[::-1]]
