# ruff: noqa
# fmt: off
"""Beam search bookkeeping in its own module, as 2018 Transformer repositories kept it."""
import torch

BOS = 0


class Beam(object):
    def __init__(self, size):
        self.size = size
        self.scores = torch.FloatTensor(size).zero_()
        self.prev_ks = []
        self.next_ys = [torch.LongTensor(size).fill_(BOS)]

    def get_current_state(self):
        return self.next_ys[-1]

    def advance(self, word_lk):
        num_words = word_lk.size(1)
        if len(self.prev_ks) > 0:
            beam_lk = word_lk + self.scores.unsqueeze(1).expand_as(word_lk)
        else:
            beam_lk = word_lk[0]
        flat_beam_lk = beam_lk.view(-1)
        best_scores, best_scores_id = flat_beam_lk.topk(self.size, 0, True, True)
        self.scores = best_scores
        # which beam each best score came from, and which word
        prev_k = best_scores_id / num_words
        self.prev_ks.append(prev_k)
        self.next_ys.append(best_scores_id - prev_k * num_words)

    def get_hypothesis(self, k):
        hyp = []
        for j in range(len(self.prev_ks) - 1, -1, -1):
            hyp.append(self.next_ys[j + 1][k])
            k = self.prev_ks[j][k]
        return [int(w) for w in hyp[::-1]]
