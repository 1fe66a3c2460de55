"""Sequences that share their prefixes: a beam's hypotheses extend each other, so each keeps only its last item and
its parent's node (a tree of prefixes); extending one costs the same at the thousandth label as at the first, where a
tuple's ``+`` copies the whole prefix. Plain Python (no torch)."""
from __future__ import annotations

from typing import Any, Iterator


class Chain:
    """An immutable sequence: ``parent`` (the sequence without its last item; None for the empty sequence), ``last``
    and ``length``. ``append`` makes a new node in O(1); ``list(chain)`` materialises the items in O(length)."""

    __slots__ = ("parent", "last", "length")

    def __init__(self, parent: Chain | None = None, last: Any = None):
        self.parent, self.last = parent, last
        self.length = 0 if parent is None else parent.length + 1

    def append(self, item: Any) -> Chain:
        """This sequence followed by ``item`` (this one is unchanged and shared)."""
        return type(self)(self, item)

    def __len__(self) -> int:
        return self.length

    def __iter__(self) -> Iterator[Any]:
        items, node = [], self
        while node.length:
            items.append(node.last)
            node = node.parent
        return reversed(items)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({list(self)})"


class Labels(Chain):
    """A label sequence that compares and hashes by its labels, as a tuple of them would: prefixes that reach the same
    labels along different alignments are the same key of a frame's merge (``prefixes.leave_frame``).

    The hash is built label by label from the parent's (O(1) per ``append``); equality walks up both sequences only
    until they meet at a shared node (at once for a prefix and the same labels reached through a sibling), comparing
    the labels on the way, so it is exact whatever the hashes."""

    __slots__ = ("_hash",)

    def __init__(self, parent: Labels | None = None, last: int | None = None):
        super().__init__(parent, last)
        self._hash = 0 if parent is None else hash((parent._hash, last))

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Labels):
            return NotImplemented
        a, b = self, other
        while a is not b:
            if a.length != b.length or a._hash != b._hash or a.last != b.last:
                return False
            if not a.length:  # two empty sequences
                return True
            a, b = a.parent, b.parent
        return True
