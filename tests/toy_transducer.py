"""A toy transducer task for tests: utterances of "words" of labels, one encoder frame per word, and a tiny model.

A trained model emits each word as a burst of labels on the word's frame.
"""
from __future__ import annotations

import torch
from torch import nn

from ssm_fairseq.asr.transducer.joiner import Joiner
from ssm_fairseq.asr.transducer.predictor import Predictor
from ssm_fairseq.asr.transducer.rnnt_loss import rnnt_loss

BLANK, FIRST_LABEL, VOCAB = 0, 4, 9  # fairseq's Dictionary: <s> (the blank), <pad>, </s>, <unk>, then 5 labels
WORDS = [(4, 5, 6, 7, 8), (8, 7, 6, 5, 4), (5, 7, 4, 8, 6)]  # five-label bursts


class ToyTransducer(nn.Module):
    """A per-frame encoder (one Linear), a one-layer LSTM predictor and the additive joiner."""

    blank = BLANK

    def __init__(self, words: int = len(WORDS)):
        super().__init__()
        self.frame_encoder = nn.Linear(words, 16)
        self.predictor = Predictor(VOCAB, embed_dim=8, hidden_dim=24, layers=1, dropout=0.0)
        self.joiner = Joiner(16, 24, joint_dim=32, vocab_size=VOCAB)

    def encoder(self, features, lengths):
        """``B x T x words`` features -> the dict ``TransducerGenerator`` reads (``encoder_out`` ``B x T x 16``)."""
        return {"encoder_out": torch.tanh(self.frame_encoder(features)), "encoder_lengths": lengths}

    def predict(self, targets):
        """``B x U`` labels -> predictor output ``B x (U+1) x 24`` (blank first)."""
        return self.predictor(torch.cat([torch.full((targets.shape[0], 1), BLANK), targets], 1))[0]

    def lattice(self, features, lengths, targets):
        """Log-probabilities ``B x T x (U+1) x V`` of the whole lattice (the full forward pass)."""
        return self.joiner(self.encoder(features, lengths)["encoder_out"], self.predict(targets)).log_softmax(-1)


def utterances(count: int, generator: torch.Generator, words=WORDS):
    """``count`` utterances of 2-4 of ``words`` (none twice in a row), padded: features ``B x T x len(words)``,
    frames ``B``, targets ``B x U`` and labels ``B``."""
    sentences = []
    for _ in range(count):
        sentence: list[int] = []
        for _ in range(int(torch.randint(2, 5, (1,), generator=generator))):
            choices = [w for w in range(len(words)) if not sentence or w != sentence[-1]]
            sentence.append(choices[int(torch.randint(len(choices), (1,), generator=generator))])
        sentences.append(sentence)
    T, width = max(len(s) for s in sentences), len(words[0])
    features = torch.zeros(count, T, len(words))
    targets = torch.full((count, width * T), BLANK)
    for b, sentence in enumerate(sentences):
        features[b, torch.arange(len(sentence)), torch.tensor(sentence)] = 1.0
        targets[b, : width * len(sentence)] = torch.tensor([label for w in sentence for label in words[w]])
    lengths = torch.tensor([len(s) for s in sentences])
    return features, lengths, targets, width * lengths


def full_loss(model: ToyTransducer, features, lengths, targets, target_lengths):
    """Per-utterance RNN-T loss of the whole lattice (exact PyTorch backend)."""
    logits = model.joiner(model.encoder(features, lengths)["encoder_out"], model.predict(targets))
    return rnnt_loss(logits, targets, lengths, target_lengths, blank=BLANK, backend="pytorch")


def train(model: nn.Module, loss_of, steps: int = 300, words=WORDS, seed: int = 0) -> list[float]:
    """Adam (1e-2) on batches of 16 fresh utterances; ``loss_of(features, lengths, targets, target_lengths)`` ->
    the scalar to minimise. Returns the losses."""
    torch.manual_seed(seed)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    generator = torch.Generator().manual_seed(seed)
    losses = []
    for _ in range(steps):
        loss = loss_of(*utterances(16, generator, words))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


class MarkerJoiner(nn.Module):
    """A joiner that emits ``unit`` at a frame whose first encoder channel is 1 (a sound, an onset), blank at every
    other frame: logits ``20 x - 10`` for ``unit``, 0 for the blank, -30 for the rest. With one label per frame it
    emits ``unit`` once per marked frame; the predictor's output is ignored."""

    def __init__(self, vocabulary: int, blank: int, unit: int):
        super().__init__()
        self.vocabulary, self.blank, self.unit = vocabulary, blank, unit

    def encoder_proj(self, encoder_out):
        return encoder_out

    def predictor_proj(self, predictor_out):
        return predictor_out[..., :1] * 0

    def step(self, encoder_proj, predictor_proj):
        logits = torch.full((encoder_proj.shape[0], self.vocabulary), -30.0)
        logits[:, self.blank] = 0.0
        logits[:, self.unit] = 20.0 * encoder_proj[:, 0] - 10.0
        return logits
