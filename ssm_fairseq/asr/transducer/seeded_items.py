"""A training dataset whose items are drawn under a seed of (seed, epoch, index): augmentation a resumed run repeats."""
from __future__ import annotations

from fairseq.data import BaseWrapperDataset, FairseqDataset, data_utils


class SeededItems(BaseWrapperDataset):
    """``dataset`` with each item drawn under ``numpy_seed(seed, epoch, index)``.

    fairseq's SpecAugment (and its other audio augmentations) draw from numpy's global generator, which
    ``fairseq-train`` seeds once at start and does not checkpoint: a run resumed from ``checkpoint_last.pt`` drew
    other masks than the uninterrupted run from the resumed update on (and each data-loader worker continues its
    own copy of the generator). Seeded per item, the masks depend only on the seed, the epoch and the utterance.
    Other attributes (``ids``, ``is_train_split``, ...) are the wrapped dataset's.
    """

    def __init__(self, dataset: FairseqDataset, seed: int):
        super().__init__(dataset)
        self.seed, self.epoch = seed, 1

    def set_epoch(self, epoch: int) -> None:
        super().set_epoch(epoch)
        self.epoch = epoch

    def __getitem__(self, index: int):
        with data_utils.numpy_seed(self.seed, self.epoch, index):
            return self.dataset[index]

    def __getattr__(self, name: str):
        if name == "dataset":  # not set yet (unpickling): no recursion
            raise AttributeError(name)
        return getattr(self.dataset, name)
