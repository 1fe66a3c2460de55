#!/usr/bin/env python
"""Generate the long-document sample that ``recipes/mlm/run.sh`` trains on when no corpus is given.

Every document is a story of several thousand words about one setting (sea, farm, city or mountain) with its
own cast of invented people and places. A cast is introduced in the opening paragraph and referred to again
thousands of words later, so predicting a masked name needs context far beyond a local attention window.
The output follows fairseq's ``masked_lm`` conventions (the format RoBERTa's pre-training uses): one
paragraph per line, an empty line between documents.

    python scripts/make_long_documents.py OUT_DIR [--train 16 --valid 2 --test 2 --words 4000 --seed 1]
        [--name-pool 0] [--split-punctuation] [--labelled 400 --labelled-words 0 --labelled-evidence anywhere]

writes ``OUT_DIR/{train,valid,test}.txt`` and, for ``sentence_prediction`` fine-tuning, the labelled
passages ``OUT_DIR/labelled/{train,valid}.tsv`` (``label<TAB>text``, the label is the passage's setting).
Everything is deterministic given ``--seed``.

A labelled passage is a few sentences of its setting by default, so a keyword anywhere in it decides the label.
``--labelled-words N`` writes instead passages of about ``N`` words whose sentences name no setting except one,
placed anywhere: the label's only evidence is that sentence, which a classifier reading the first token's
encoding (``sentence_prediction``) sees only if its encoder's reach spans the distance. ``--labelled-evidence
first`` puts that sentence first instead (the control: the same passages, the evidence next to the first token).

By default every document invents its own names, so a word-level vocabulary built on the training split has
never seen the names of a held-out document. ``--name-pool N`` draws every document's people and places from one
pool of ``N`` invented names instead: the held-out names are in the vocabulary, and which of them a document uses
is known only from its earlier text (what a language model's long-range memory is for). ``--split-punctuation``
writes commas and full stops as words of their own (WikiText's tokenisation), so a name is the same word wherever
it stands in a sentence.
"""
from __future__ import annotations

import argparse
import random
import re
from pathlib import Path

SETTINGS = {
    "sea": (["harbour", "ship", "sail", "tide", "net", "storm", "lighthouse", "island", "wave", "anchor"],
            ["rowed", "sailed", "anchored", "fished", "steered", "drifted"]),
    "farm": (["barn", "field", "plough", "harvest", "orchard", "goat", "wheat", "fence", "well", "meadow"],
             ["planted", "harvested", "fed", "ploughed", "milked", "mended"]),
    "city": (["market", "tram", "office", "bridge", "tower", "street", "square", "library", "station", "cafe"],
             ["hurried", "traded", "waited", "bargained", "wrote", "argued"]),
    "mountain": (["ridge", "glacier", "cabin", "pass", "summit", "rope", "snow", "valley", "cliff", "pine"],
                 ["climbed", "camped", "descended", "waited", "crossed", "rested"]),
}
LINKS = ["near", "beyond", "behind", "below", "above", "beside"]
TIMES = ["at dawn", "in the evening", "before noon", "after the rain", "that winter", "the next day", "at night"]
SYLLABLES = ["ka", "lo", "mi", "ren", "tor", "vi", "sa", "ul", "de", "bran", "el", "fi", "go", "har", "is", "jo"]


def invented_name(rng: random.Random) -> str:
    """A capitalised word of two or three syllables (people and places)."""
    return "".join(rng.choice(SYLLABLES) for _ in range(rng.randint(2, 3))).capitalize()


def sentence(rng: random.Random, setting: str, cast: list[str], places: list[str]) -> str:
    """One sentence about a member of the cast in the setting."""
    nouns, verbs = SETTINGS[setting]
    who, where = rng.choice(cast), rng.choice(places)
    return rng.choice([
        f"{who} {rng.choice(verbs)} {rng.choice(LINKS)} the {rng.choice(nouns)} of {where} {rng.choice(TIMES)}.",
        f"{rng.choice(TIMES).capitalize()}, {who} remembered the {rng.choice(nouns)} that {rng.choice(cast)} "
        f"had {rng.choice(verbs)} {rng.choice(LINKS)} {where}.",
        f"The {rng.choice(nouns)} {rng.choice(LINKS)} {where} was where {who} and {rng.choice(cast)} first "
        f"{rng.choice(verbs)}.",
        f"Everyone in {where} knew that {who} {rng.choice(verbs)} whenever the {rng.choice(nouns)} was quiet.",
    ])


def name_pool(rng: random.Random, size: int) -> list[str]:
    """``size`` distinct invented names."""
    if size > len(SYLLABLES) ** 2:
        raise ValueError(f"a name pool holds at most {len(SYLLABLES) ** 2} names, got {size}")
    names: set[str] = set()
    while len(names) < size:
        names.add(invented_name(rng))
    return sorted(names)


def document(rng: random.Random, words: int, pool: list[str] | None = None) -> list[str]:
    """Paragraphs of one story of about ``words`` words; its names come from ``pool`` when given (else invented)."""
    setting = rng.choice(sorted(SETTINGS))
    if pool:
        people, places_count = rng.randint(3, 5), rng.randint(2, 4)
        names = rng.sample(pool, 2 * people + places_count)
        cast = [f"{names[2 * i]} {names[2 * i + 1]}" for i in range(people)]
        places = names[2 * people:]
    else:
        cast = [f"{invented_name(rng)} {invented_name(rng)}" for _ in range(rng.randint(3, 5))]
        places = [invented_name(rng) for _ in range(rng.randint(2, 4))]
    paragraphs = [f"This is the story of {', '.join(cast[:-1])} and {cast[-1]}, who lived in "
                  f"{' and '.join(places)}, in the {setting} country."]
    count = len(paragraphs[0].split())
    while count < words:
        paragraph = " ".join(sentence(rng, setting, cast, places) for _ in range(rng.randint(4, 9)))
        paragraphs.append(paragraph)
        count += len(paragraph.split())
    return paragraphs


def neutral_sentence(rng: random.Random, cast: list[str], places: list[str]) -> str:
    """One sentence of the stories' own words that names no setting (no setting's nouns or verbs)."""
    who, other, where = rng.choice(cast), rng.choice(cast), rng.choice(places)
    return rng.choice([
        f"{rng.choice(TIMES).capitalize()}, {who} remembered {other}.",
        f"Everyone in {where} knew that {who} and {other} lived {rng.choice(LINKS)} {where}.",
        f"{who} and {other} first met in {where} {rng.choice(TIMES)}.",
    ])


def labelled_passage(rng: random.Random, words: int = 0, evidence: str = "anywhere") -> tuple[str, str]:
    """A passage and its setting: a few sentences of the setting, or (``words`` > 0) about ``words`` words of
    neutral sentences with one sentence of the setting at a uniformly drawn place (``evidence="anywhere"``) or
    first (``"first"``)."""
    setting = rng.choice(sorted(SETTINGS))
    cast = [invented_name(rng) for _ in range(2)]
    places = [invented_name(rng)]
    if not words:
        return setting, " ".join(sentence(rng, setting, cast, places) for _ in range(rng.randint(2, 4)))
    sentences: list[str] = []
    while sum(len(s.split()) for s in sentences) < words:
        sentences.append(neutral_sentence(rng, cast, places))
    place = rng.randint(0, len(sentences))  # drawn either way: "first" keeps the passages of "anywhere"
    sentences.insert(0 if evidence == "first" else place, sentence(rng, setting, cast, places))
    return setting, " ".join(sentences)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--train", type=int, default=16, help="training documents")
    parser.add_argument("--valid", type=int, default=2, help="validation documents")
    parser.add_argument("--test", type=int, default=2, help="test documents")
    parser.add_argument("--words", type=int, default=4000, help="words per document (about)")
    parser.add_argument("--labelled", type=int, default=400, help="labelled passages (4/5 train, 1/5 valid)")
    parser.add_argument("--labelled-words", type=int, default=0,
                        help="words per labelled passage, all neutral but one sentence of its setting (0: a few "
                             "sentences of the setting)")
    parser.add_argument("--labelled-evidence", choices=("anywhere", "first"), default="anywhere",
                        help="with --labelled-words: where the one sentence of the setting stands")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--name-pool", type=int, default=0,
                        help="draw every document's names from one pool of this many (0: each invents its own)")
    parser.add_argument("--split-punctuation", action="store_true", help="commas and full stops as separate words")
    args = parser.parse_args(argv)
    if args.name_pool and args.name_pool < 2 * 5 + 4:
        parser.error(f"--name-pool must hold at least 14 names (a cast of 5 and 4 places), got {args.name_pool}")
    rng = random.Random(args.seed)
    pool = name_pool(rng, args.name_pool) if args.name_pool else None
    args.out.mkdir(parents=True, exist_ok=True)
    for split in ("train", "valid", "test"):
        documents = ["\n".join(document(rng, args.words, pool)) for _ in range(getattr(args, split))]
        text = "\n\n".join(documents) + "\n"
        if args.split_punctuation:
            text = re.sub(r"([.,])(?= |$)", r" \1", text, flags=re.M)
        (args.out / f"{split}.txt").write_text(text, encoding="utf-8")
    (args.out / "labelled").mkdir(exist_ok=True)
    passages = [labelled_passage(rng, args.labelled_words, args.labelled_evidence) for _ in range(args.labelled)]
    n_train = len(passages) * 4 // 5
    for split, rows in (("train", passages[:n_train]), ("valid", passages[n_train:])):
        text = "".join(f"{label}\t{passage}\n" for label, passage in rows)
        (args.out / "labelled" / f"{split}.tsv").write_text(text, encoding="utf-8")
    print(f"wrote {args.train}/{args.valid}/{args.test} documents and {len(passages)} labelled passages to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
