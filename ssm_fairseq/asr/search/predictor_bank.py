"""The predictor states of every prefix a beam search has in play, one row each."""
from __future__ import annotations

from typing import Sequence

import torch
from torch import Tensor

from ..transducer.predictor import State
from .hypothesis import advance_predictor, select_rows


class PredictorBank:
    """Rows of predictor output and state: ``proj`` ``R x J`` (the joiner's projection of the predictor output) and
    ``state`` (the LSTM's ``(h, c)`` per layer, ``layers x R x H`` each). Rows are numbered as they are added;
    ``keep`` renumbers them."""

    def __init__(self, proj: Tensor, state: State):
        self.proj, self.state = proj, state

    def extend(self, model, parents: Sequence[int], labels: Sequence[int]) -> int:
        """Add one row per parent: ``parents[i]``'s state fed ``labels[i]``, in one predictor step -> the number of
        the first new row (the others follow in order)."""
        device = self.proj.device
        new_proj, new_state = advance_predictor(model, torch.tensor(labels, device=device),
                                                select_rows(self.state, torch.tensor(parents, device=device)))
        first = self.proj.shape[0]
        self.proj = torch.cat([self.proj, new_proj])
        self.state = [(torch.cat([h, nh], 1), torch.cat([c, nc], 1)) for (h, c), (nh, nc) in zip(self.state, new_state)]
        return first

    def keep(self, rows: Sequence[int]) -> dict[int, int]:
        """Keep only ``rows`` -> {old row: new row}, numbered in ascending order of the old."""
        used = sorted(set(rows))
        index = torch.tensor(used, device=self.proj.device)
        self.proj, self.state = self.proj[index], select_rows(self.state, index)
        return {row: n for n, row in enumerate(used)}
