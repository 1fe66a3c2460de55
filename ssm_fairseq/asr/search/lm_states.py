"""A fairseq language model's incremental states for the many hypotheses of a search, stepped in as few LM calls as
those states allow.

fairseq's incremental decoders (``transformer_lm``, ``lstm_lm``, ``spade_lm``) keep one state per batch row, and the
rows of one incremental state step together. Here the rows live in banks: a bank is one incremental state whose rows
were computed by one LM call. Advancing a set of rows gathers each row from its bank with the LM's own
``reorder_incremental_state`` (as fairseq's beam search reorders; it selects into new tensors, so a bank is never
written to), concatenates the gathered states that can share a step along their batch dimension, and runs one LM
step for each such set: each row's step sees exactly the labels of its hypothesis, as the full forward pass would.
Rows gathered from several banks are kept together as one bank (``_consolidate``), so that a beam's prefixes, which
come from the banks of many earlier steps, are gathered from one bank at their next step.

Which rows can share a step: every row, where the decoder concatenates states of any prefix lengths itself
(``concatenate_incremental_states``: ``spade_lm``'s, whose attention windows mask each row's missing keys; its SSM
state has a fixed size); otherwise those whose states have the same structure, the same values outside tensors
(counters) and tensors of the same shapes apart from the batch dimension (the ``merge_key``). A fixed-size state
(fairseq's ``lstm_lm``) always matches, so every row steps in one call; a state that grows with the prefix
(``transformer_lm``'s keys and values) matches only rows of the same length. The LM is fed each row's whole prefix,
left-padded (fairseq's convention), so rows of different lengths also need a decoder that reads the last token alone
(``LAST_TOKEN_DECODERS``) or one that concatenates its states; rows of other decoders share a step only with rows of
their own length.

Each state tensor's batch dimension is learned once per place in the state's structure, from the LM's own reorder:
it is the dimension that a reorder to one row more lengthens.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Hashable, Iterator, Sequence

import torch
from fairseq.models.lstm import LSTMDecoder
from torch import Tensor

# Decoders whose incremental step reads only the last token of the prefix it is given (its length nowhere else), so
# that rows of different lengths, left-padded to one width, step together when their states match.
LAST_TOKEN_DECODERS = (LSTMDecoder,)

Path = tuple  # where a leaf sits in a nested state: the dict keys and list indices leading to it


class StateLayoutError(RuntimeError):
    """A language model whose incremental state is not laid out as fairseq's convention says (one batch row each)."""


@dataclass
class _Bank:
    """An incremental state of ``size`` rows that one LM call computed, and the key of the rows that may share a step
    with its rows."""

    state: dict
    size: int
    merge_key: Hashable


def _copy_structure(value: Any) -> Any:
    """A copy of nested dicts, lists and tuples sharing their tensors: fairseq's reorders replace the tensors of a
    state (``index_select``), so reordering the copy leaves the original as it was."""
    if isinstance(value, dict):
        return {key: _copy_structure(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_copy_structure(item) for item in value)
    return value


def _leaves(value: Any, path: Path = ()) -> Iterator[tuple[Path, Any]]:
    """(path, leaf) of every value in nested dicts, lists and tuples, in their order."""
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _leaves(item, path + (key,))
    elif isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            yield from _leaves(item, path + (index,))
    else:
        yield path, value


def _rebuild(parts: Sequence[Any], leaf: Any, path: Path = ()) -> Any:
    """``parts[0]``'s structure with each leaf replaced by ``leaf(path, [the parts' leaves at path])``."""
    first = parts[0]
    if isinstance(first, dict):
        return {key: _rebuild([part[key] for part in parts], leaf, path + (key,)) for key in first}
    if isinstance(first, (list, tuple)):
        return type(first)(_rebuild([part[i] for part in parts], leaf, path + (i,)) for i in range(len(first)))
    return leaf(path, parts)


class LanguageModelStates:
    """Rows of LM states (plain integers, numbered as they are added), each after its own prefix of labels.

    Args:
        lm: a ``FairseqLanguageModel`` with an incremental decoder.
        pad: the unit that left-pads shorter prefixes where rows of different lengths step together.

    ``calls`` counts the LM steps run (one per set of rows that could share one).
    """

    def __init__(self, lm, pad: int):
        self.lm, self.pad = lm, pad
        self.device = next(lm.parameters()).device
        # fairseq's reorder_incremental_state_scripting calls these, found again at every call
        self._reorderers = [module for module in lm.decoder.modules() if hasattr(module, "reorder_incremental_state")]
        # a decoder that concatenates the states of rows of any prefix lengths itself (spade_lm's)
        self._concatenate_states = getattr(lm.decoder, "concatenate_incremental_states", None)
        self._any_length = isinstance(lm.decoder, LAST_TOKEN_DECODERS) or self._concatenate_states is not None
        self._batch_dims: dict[Path, int | None] = {}
        self._banks: list[_Bank] = []  # of each row
        self._indices: list[int] = []  # each row's index in its bank
        self.prefixes: list[tuple[int, ...]] = []  # each row's labels fed to the LM
        self.calls = 0

    def __len__(self) -> int:
        return len(self.prefixes)

    @torch.no_grad()
    def start(self, prefix: tuple[int, ...], count: int) -> Tensor:
        """Add ``count`` rows fed ``prefix`` -> their next-unit log-probabilities, ``count x V`` float32."""
        log_probs, bank = self._step([prefix] * count, {})
        self._add(bank, range(count), [prefix] * count)
        return log_probs

    @torch.no_grad()
    def advance(self, rows: Sequence[int], labels: Sequence[int]) -> Tensor:
        """Add one row per ``rows[i]``: its prefix followed by ``labels[i]``, numbered ``len(self) + i`` -> their
        next-unit log-probabilities, ``N x V`` float32, in the order of ``rows``. One LM call per set of rows whose
        states can share a step."""
        first = len(self)
        prefixes = [self.prefixes[row] + (label,) for row, label in zip(rows, labels)]
        self._banks.extend([None] * len(rows))
        self._indices.extend([0] * len(rows))
        self.prefixes.extend(prefixes)
        sets: dict[Hashable, dict[int, list[int]]] = {}  # merge key -> {id(bank): positions}
        for position, row in enumerate(rows):
            bank = self._banks[row]
            key = bank.merge_key if self._any_length else (bank.merge_key, len(prefixes[position]))
            sets.setdefault(key, {}).setdefault(id(bank), []).append(position)
        out = None
        for by_bank in sets.values():
            positions = [p for bank_positions in by_bank.values() for p in bank_positions]
            parts = [self._gather(self._banks[rows[ps[0]]], [self._indices[rows[p]] for p in ps])
                     for ps in by_bank.values()]
            state = parts[0] if len(parts) == 1 else self._consolidate([rows[p] for p in positions],
                                                                       self._concatenate(parts))
            log_probs, bank = self._step([prefixes[p] for p in positions], state)
            for index, position in enumerate(positions):
                self._banks[first + position], self._indices[first + position] = bank, index
            if out is None:
                out = log_probs.new_empty(len(rows), log_probs.shape[1])
            out[torch.tensor(positions, device=out.device)] = log_probs
        return out if out is not None else torch.empty(0, 0)

    def _consolidate(self, parents: list[int], state: dict) -> dict:
        """Make ``state``, the rows ``parents`` gathered from several banks, their bank (a row listed twice keeps
        its first copy), so that their next step gathers from one bank where it would gather from each of theirs
        (a beam's prefixes come from the banks of many earlier steps) -> a copy of it to step, as a step writes into
        the state it is given (of a ``LayerCacheDecoder``'s: a copy of its structure, sharing its tensors)."""
        bank = _Bank(state, len(parents), self._merge_key(state, len(parents)))
        for index, row in enumerate(parents):
            if self._banks[row] is not bank:
                self._banks[row], self._indices[row] = bank, index
        if getattr(self.lm.decoder, "STEP_KEEPS_ROWS", False):  # one step leaves the rows (LayerCacheDecoder's)
            return _copy_structure(state)
        return self._gather(bank, list(range(len(parents))))

    def keep(self, rows: Sequence[int]) -> None:
        """Keep only ``rows`` (distinct, ascending), renumbered ``0, 1, ...`` in that order. The rows kept of banks
        whose rows could share a step are gathered into one bank (of a single such bank: it shrinks to them, in
        place), so that the next steps gather from as few banks as possible; banks without a row kept are dropped."""
        groups: dict[Hashable, dict[int, tuple[_Bank, list[int]]]] = {}  # merge key -> {id(bank): (bank, indices)}
        for row in rows:
            bank = self._banks[row]
            groups.setdefault(bank.merge_key, {}).setdefault(id(bank), (bank, []))[1].append(self._indices[row])
        moved: dict[tuple[int, int], tuple[_Bank, int]] = {}  # (id(bank), index) -> (its bank, index) from now on
        for by_bank in groups.values():
            kept = [(bank, sorted(set(indices))) for bank, indices in by_bank.values()]
            if len(kept) == 1:
                bank, distinct = kept[0]
                if len(distinct) < bank.size:
                    self._reorder(bank.state, torch.tensor(distinct, device=self.device))
                    bank.size = len(distinct)
                merged, offsets = bank, [0]
            else:
                size = sum(len(distinct) for _, distinct in kept)
                state = self._concatenate([self._gather(bank, distinct) for bank, distinct in kept])
                merged = _Bank(state, size, self._merge_key(state, size))
                offsets = [0]
                for _, distinct in kept[:-1]:
                    offsets.append(offsets[-1] + len(distinct))
            for (bank, distinct), offset in zip(kept, offsets):
                moved.update({(id(bank), old): (merged, offset + new) for new, old in enumerate(distinct)})
        places = [moved[id(self._banks[row]), self._indices[row]] for row in rows]
        self._banks = [bank for bank, _ in places]
        self._indices = [index for _, index in places]
        self.prefixes = [self.prefixes[row] for row in rows]

    def _step(self, prefixes: list[tuple[int, ...]], state: dict) -> tuple[Tensor, _Bank]:
        """Feed the last label of each prefix (``n`` of them; the whole prefixes, left-padded, as fairseq's incremental
        decoders take them) with ``state`` -> ``n x V`` float32 log-probabilities and the bank of the new rows."""
        width = max(len(prefix) for prefix in prefixes)
        tokens = torch.tensor([(self.pad,) * (width - len(prefix)) + prefix for prefix in prefixes],
                              dtype=torch.long, device=self.device)
        out = self.lm.decoder(tokens, incremental_state=state)
        self.calls += 1
        log_probs = self.lm.get_normalized_probs(out, log_probs=True)[:, -1].float()
        return log_probs, _Bank(state, len(prefixes), self._merge_key(state, len(prefixes)))

    def _add(self, bank: _Bank, indices, prefixes) -> None:
        for index, prefix in zip(indices, prefixes):
            self._banks.append(bank)
            self._indices.append(index)
            self.prefixes.append(prefix)

    def _reorder(self, state: dict, order: Tensor) -> None:
        """Select the batch rows ``order`` of ``state`` in place, as ``reorder_incremental_state_scripting``."""
        for module in self._reorderers:
            module.reorder_incremental_state(state, order)

    def _gather(self, bank: _Bank, indices: list[int]) -> dict:
        """A new state of ``bank``'s rows ``indices`` (new tensors: stepping it leaves the bank as it was)."""
        state = _copy_structure(bank.state)
        self._reorder(state, torch.tensor(indices, device=self.device))
        return state

    def _concatenate(self, states: list[dict]) -> dict:
        """One state of the rows of ``states`` (equal ``merge_key``s), in order."""
        if self._concatenate_states is not None:
            return self._concatenate_states(states)

        def leaf(path: Path, values: list) -> Any:
            dim = self._batch_dims.get(path)
            return values[0] if dim is None else torch.cat(values, dim)
        return _rebuild(states, leaf)

    def _merge_key(self, state: dict, size: int) -> Hashable:
        """What a state must share with another for their rows to step together: its structure, its values outside
        tensors, its tensors' dtypes and shapes without the batch dimension (and its tensors without one: the same
        objects); nothing where the decoder concatenates any of its states."""
        if self._concatenate_states is not None:
            return ()
        leaves = list(_leaves(state))
        if any(isinstance(value, Tensor) and path not in self._batch_dims for path, value in leaves):
            self._learn_batch_dims(state, size)
        key = []
        for path, value in leaves:
            if isinstance(value, Tensor):
                dim = self._batch_dims[path]
                shape = tuple(value.shape) if dim is None else value.shape[:dim] + value.shape[dim + 1:]
                key.append((path, value.dtype, shape) if dim is not None else (path, id(value)))
            elif value is None or isinstance(value, (bool, int, float, str)):
                key.append((path, value))
            else:
                key.append((path, id(value)))  # an object the rows share (spade_lm's SSM recurrence): the same one
        return tuple(key)

    def _learn_batch_dims(self, state: dict, size: int) -> None:
        """The batch dimension of each tensor of ``state`` (``size`` rows): the one a reorder to ``size + 1`` rows
        lengthens; None for a tensor it leaves as it is (no batch dimension)."""
        probe = _copy_structure(state)
        self._reorder(probe, torch.arange(size + 1, device=self.device) % size)
        grown = dict(_leaves(probe))
        for path, value in _leaves(state):
            if not isinstance(value, Tensor) or path in self._batch_dims:
                continue
            after = grown.get(path)
            changed = ([d for d in range(value.dim()) if after.shape[d] != value.shape[d]]
                       if isinstance(after, Tensor) and after.dim() == value.dim() else None)
            if changed is None or len(changed) > 1 or changed and (
                    value.shape[changed[0]], after.shape[changed[0]]) != (size, size + 1):
                found = tuple(after.shape) if isinstance(after, Tensor) else repr(after)
                raise StateLayoutError(
                    f"{type(self.lm.decoder).__name__}'s incremental state at {path} is not a tensor with one batch "
                    f"dimension: reordering {size} rows to {size + 1} made {tuple(value.shape)} into {found}")
            self._batch_dims[path] = changed[0] if changed else None


def language_model_states(lm, pad: int):
    """The rows' LM states for a search: the decoder's own token store where it has one (``spade_lm``'s
    ``token_store``: each token's keys stored once, a row's window a list of indices, so that branching, stepping
    and dropping rows copies no keys), else ``LanguageModelStates``. Both: ``start``, ``advance``, ``keep``, ``len``
    and ``calls``."""
    token_store = getattr(lm.decoder, "token_store", None)
    return token_store() if token_store is not None else LanguageModelStates(lm, pad)
