"""Sequences that share their prefixes (asr/search/prefix_tree.py): the same items, hashes and equality as tuples."""
import random

from ssm_fairseq.asr.search.prefix_tree import Chain, Labels


def _build(labels, root=None):
    node = root if root is not None else Labels()
    for label in labels:
        node = node.append(label)
    return node


def test_chain_materialises_its_items_and_shares_its_parent():
    empty = Chain()
    a = empty.append(0.5).append(-1.0)
    b = a.append(2.0)
    assert list(empty) == [] and len(empty) == 0
    assert list(a) == [0.5, -1.0] and len(a) == 2
    assert list(b) == [0.5, -1.0, 2.0] and b.parent is a  # a is unchanged and shared


def test_labels_compare_and_hash_as_tuples_of_their_labels():
    rng = random.Random(0)
    root = Labels()
    sequences = [tuple(rng.randrange(3) for _ in range(rng.randrange(6))) for _ in range(300)]
    # the same labels reached along different paths: a shared root, separate roots, through a sibling's prefix
    nodes = [_build(s, root if i % 2 else None) for i, s in enumerate(sequences)]
    for (s, x) in zip(sequences[:60], nodes[:60]):
        for (t, y) in zip(sequences, nodes):
            assert (x == y) == (s == t), (s, t)
            if s == t:
                assert hash(x) == hash(y)
    merged = {}
    for s, node in zip(sequences, nodes):
        merged.setdefault(node, s)
        assert merged[node] == s
    assert len(merged) == len(set(sequences))
    assert Labels() == Labels() and Labels().append(1) != (1,)


def test_equal_labels_with_colliding_hashes_are_told_apart():
    a, b = _build([1, 2]), _build([2, 1])
    b._hash = a._hash  # force a collision: equality still compares the labels
    assert a != b
