"""Synthesise a mini speech corpus in LibriSpeech layout with espeak-ng, small enough to commit to git.

Sentences come from a small grammar of its own (about 200 words, 4 to 12 words a sentence, upper case, no
punctuation). Each speaker is one espeak-ng voice at one speaking rate and pitch; every speaker reads in train,
and dev and test are read by the same speakers. Dev and test sentences never occur in train, but every one of
their words does. One more test subset, ``test-unheard`` (``--test-unheard N``), is read by speakers whose voices
(``UNHEARD_VOICES``: other accents and a variant that no training speaker has) read nowhere else: how a model
does on a voice it never heard. Its sentences are drawn after test-large's, so no other subset depends on it. Audio is resampled to 16 kHz, trimmed of leading and trailing silence and stored as 8-bit FLAC
(rounded, no dither, highest compression), about 6 KB a second. The output, for ``--out recipes/librispeech/mini``::

    recipes/librispeech/mini/README.md
    recipes/librispeech/mini/LibriSpeech/train-mini/101/1001/101-1001.trans.txt
    recipes/librispeech/mini/LibriSpeech/train-mini/101/1001/101-1001-0001.flac
    ...

Run from the repository root: ``python scripts/make_mini_librispeech.py``. Same seed, same corpus (given the
same espeak-ng version). ``--subsets test-unheard`` (re)writes only the subsets named, into an existing corpus,
leaving the others' files as they are; the README is rewritten, with the durations of the subsets not written
read from their files.

``--lm-text FILE --lm-sentences N`` writes instead (no audio, no espeak-ng) N more sentences of the grammar, one per
line, none of them a dev or test sentence of the corpus of that ``--seed``: a language-model corpus for the mini
corpus, as LibriSpeech's LM corpus is for LibriSpeech (books other than the evaluation sets').
"""
from __future__ import annotations

import argparse
import io
import logging
import random
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import soundfile as sf
import torch
import torchaudio

SAMPLE_RATE = 16000
SUBSETS = ("train-mini", "dev-mini", "test-mini", "test-large")  # read by the speakers of VOICES
UNHEARD_SUBSET = "test-unheard"  # read by the speakers of UNHEARD_VOICES alone
ALL_SUBSETS = SUBSETS + (UNHEARD_SUBSET,)
MIN_WORDS, MAX_WORDS = 4, 12

# --- The grammar. Nouns are (singular, plural) pairs; places only take the singular. ---
NAMES = ("MARY", "JOHN", "ANNA", "PETER", "LUCY", "THOMAS", "EMMA", "GEORGE", "ALICE", "HENRY")
AGENTS = (("FARMER", "FARMERS"), ("BAKER", "BAKERS"), ("TEACHER", "TEACHERS"), ("DOCTOR", "DOCTORS"),
          ("SAILOR", "SAILORS"), ("CHILD", "CHILDREN"), ("WOMAN", "WOMEN"), ("MAN", "MEN"), ("GIRL", "GIRLS"),
          ("BOY", "BOYS"), ("KING", "KINGS"), ("DOG", "DOGS"), ("CAT", "CATS"), ("HORSE", "HORSES"),
          ("BIRD", "BIRDS"), ("FOX", "FOXES"))
THINGS = (("APPLE", "APPLES"), ("BASKET", "BASKETS"), ("BOOK", "BOOKS"), ("LETTER", "LETTERS"), ("BOX", "BOXES"),
          ("CUP", "CUPS"), ("KEY", "KEYS"), ("LAMP", "LAMPS"), ("HAT", "HATS"), ("BOAT", "BOATS"),
          ("STONE", "STONES"), ("CANDLE", "CANDLES"), ("BELL", "BELLS"), ("RING", "RINGS"))
PLACES = ("RIVER", "MARKET", "GARDEN", "FOREST", "VILLAGE", "HOUSE", "BRIDGE", "STATION", "HILL", "KITCHEN", "SCHOOL", "LAKE")
AGENT_ADJECTIVES = ("OLD", "YOUNG", "LITTLE", "TALL", "HAPPY", "TIRED", "HUNGRY", "BRAVE", "CLEVER", "QUIET")
THING_ADJECTIVES = ("OLD", "LITTLE", "BIG", "SMALL", "RED", "GREEN", "BLUE", "WHITE", "HEAVY", "WOODEN")
PLACE_ADJECTIVES = ("OLD", "BIG", "SMALL", "QUIET", "DARK", "GREEN")
TRANSITIVE_VERBS = ("CARRIED", "OPENED", "FOUND", "LOST", "SAW", "WATCHED", "FOLLOWED", "PAINTED", "CLEANED",
                    "BOUGHT", "SOLD", "BROUGHT", "PUSHED", "DROPPED", "HELD", "FIXED", "CAUGHT", "CHASED", "HELPED", "CALLED")
INTRANSITIVE_VERBS = ("SLEPT", "WAITED", "SANG", "DANCED", "LAUGHED", "RESTED", "WORKED", "PLAYED", "SAT", "STOOD")
MOTION_VERBS = ("WALKED", "RAN", "HURRIED", "WENT", "CAME", "RODE")
LOCATIVE_PREPOSITIONS = ("IN", "NEAR", "BEHIND", "UNDER", "ACROSS", "BESIDE")
MOTION_PREPOSITIONS = ("TO", "FROM", "INTO", "THROUGH", "TOWARD")
ADVERBS = ("SLOWLY", "QUICKLY", "QUIETLY", "CAREFULLY", "HAPPILY", "SUDDENLY", "AGAIN", "TOGETHER", "GENTLY", "LOUDLY")
TIMES = ("YESTERDAY", "TODAY", "LAST NIGHT", "THIS MORNING", "IN THE EVENING", "ON MONDAY", "ON FRIDAY",
         "ON SUNDAY", "IN SUMMER", "IN WINTER")
NUMBERS = ("TWO", "THREE", "FOUR", "FIVE", "SIX", "SEVEN", "EIGHT", "TEN")
# A word repeated in a tuple is drawn more often.
SINGULAR_DETERMINERS = ("THE", "THE", "A", "THIS", "THAT", "EVERY", "HER", "HIS", "OUR", "THEIR", "MY", "ONE")
PLURAL_DETERMINERS = ("THE", "THE", "SOME", "MANY", "THESE", "THOSE", "SEVERAL", "HER", "HIS", "OUR", "THEIR")
PLACE_DETERMINERS = ("THE", "THE", "THE", "A", "THAT", "HER", "HIS", "OUR", "THEIR")
# Words that only the templates below spell out.
TEMPLATE_WORDS = ("AN", "AND", "WAS", "WERE", "THERE", "WITH")

# --- Speakers: one espeak-ng voice (a language, optionally with a "+variant") at one rate and pitch each. ---
VOICES = ("en-us", "en-gb", "en-gb-x-rp", "en-029", "en-us+f2", "en-gb+f3")
RATES = range(160, 201, 10)  # words per minute
PITCHES = range(30, 71, 5)  # espeak-ng's 0-99 scale, 50 by default
# Voices no speaker of VOICES has, for test-unheard: a Scottish and a New York accent, the latter with a variant
# (f4) that no training speaker uses.
UNHEARD_VOICES = ("en-gb-scotland", "en-us-nyc+f4")


def vocabulary() -> set[str]:
    """Every word the grammar can produce."""
    lists = (NAMES, PLACES, AGENT_ADJECTIVES, THING_ADJECTIVES, PLACE_ADJECTIVES, TRANSITIVE_VERBS,
             INTRANSITIVE_VERBS, MOTION_VERBS, LOCATIVE_PREPOSITIONS, MOTION_PREPOSITIONS, ADVERBS, TIMES, NUMBERS,
             SINGULAR_DETERMINERS, PLURAL_DETERMINERS, PLACE_DETERMINERS, TEMPLATE_WORDS)
    nouns = [noun for pair in AGENTS + THINGS for noun in pair]
    return {word for phrase in nouns + [p for words in lists for p in words] for word in phrase.split()}


def _with_article(words: list[str]) -> list[str]:
    """``A`` becomes ``AN`` before a word spelt with a leading vowel (which is right for every word here)."""
    if words[0] == "A" and words[1][0] in "AEIOU":
        return ["AN"] + words[1:]
    return words


def _noun_phrase(rng: random.Random, nouns: tuple, adjectives: tuple, adjective_p: float,
                 plural: bool) -> list[str]:
    """A determiner or number, an optional adjective and a noun: ``THE OLD FARMER``, ``SEVEN RED APPLES``."""
    singular_noun, plural_noun = rng.choice(nouns)
    adjective = [rng.choice(adjectives)] if rng.random() < adjective_p else []
    if not plural:
        return _with_article([rng.choice(SINGULAR_DETERMINERS)] + adjective + [singular_noun])
    determiner = rng.choice(NUMBERS) if rng.random() < 0.4 else rng.choice(PLURAL_DETERMINERS)
    return [determiner] + adjective + [plural_noun]


def _place(rng: random.Random) -> list[str]:
    """``THE RIVER``, ``OUR QUIET GARDEN``."""
    adjective = [rng.choice(PLACE_ADJECTIVES)] if rng.random() < 0.2 else []
    return _with_article([rng.choice(PLACE_DETERMINERS)] + adjective + [rng.choice(PLACES)])


def _subject(rng: random.Random) -> list[str]:
    """A name or a noun phrase of people or animals."""
    if rng.random() < 0.45:
        return [rng.choice(NAMES)]
    return _noun_phrase(rng, AGENTS, AGENT_ADJECTIVES, 0.3, rng.random() < 0.4)


def _object(rng: random.Random) -> list[str]:
    """A name or a noun phrase of things, people or animals."""
    if rng.random() < 0.15:
        return [rng.choice(NAMES)]
    if rng.random() < 0.7:
        return _noun_phrase(rng, THINGS, THING_ADJECTIVES, 0.3, rng.random() < 0.4)
    return _noun_phrase(rng, AGENTS, AGENT_ADJECTIVES, 0.3, rng.random() < 0.4)


def _optional(rng: random.Random, p: float, make: Callable[[random.Random], list[str]]) -> list[str]:
    """``make(rng)`` with probability ``p``, else nothing."""
    return make(rng) if rng.random() < p else []


def _adverb(rng: random.Random) -> list[str]:
    """``SLOWLY``."""
    return [rng.choice(ADVERBS)]


def _time(rng: random.Random) -> list[str]:
    """``ON MONDAY``."""
    return rng.choice(TIMES).split()


def _location(rng: random.Random) -> list[str]:
    """``UNDER THE BRIDGE``."""
    return [rng.choice(LOCATIVE_PREPOSITIONS)] + _place(rng)


def sentence(rng: random.Random) -> str:
    """One sentence of ``MIN_WORDS`` to ``MAX_WORDS`` words from one of six templates, e.g.
    ``THE OLD FARMER CARRIED SEVEN RED APPLES TO THE MARKET`` (draws again while the length is out of range)."""
    while True:
        template = rng.randrange(6)
        if template == 0:  # JOHN FOUND THE KEY UNDER THE TABLE
            words = _subject(rng) + [rng.choice(TRANSITIVE_VERBS)] + _object(rng) + _optional(rng, 0.25, _location)
            words += _optional(rng, 0.2, _adverb)
        elif template == 1:  # THE CHILDREN SANG HAPPILY IN THE KITCHEN
            words = _subject(rng) + [rng.choice(INTRANSITIVE_VERBS)] + _optional(rng, 0.4, _adverb)
            words += _optional(rng, 0.4, _location) + _optional(rng, 0.25, _time)
        elif template == 2:  # MARY WALKED TO THE STATION ON MONDAY
            words = _subject(rng) + [rng.choice(MOTION_VERBS), rng.choice(MOTION_PREPOSITIONS)] + _place(rng)
            words += _optional(rng, 0.3, _time)
        elif template == 3:  # THERE WERE NINE BOATS NEAR THE RIVER
            plural = rng.random() < 0.5
            thing = _noun_phrase(rng, THINGS + AGENTS, THING_ADJECTIVES, 0.3, plural)
            words = ["THERE", "WERE" if plural else "WAS"] + thing + _location(rng)
        elif template == 4:  # THE HORSES WERE TIRED YESTERDAY
            plural = rng.random() < 0.4
            subject = _noun_phrase(rng, AGENTS, AGENT_ADJECTIVES, 0.2, plural)
            words = subject + ["WERE" if plural else "WAS", rng.choice(AGENT_ADJECTIVES)] + _optional(rng, 0.5, _time)
        else:  # ALICE AND PETER PAINTED THE BOX WITH THE CHILDREN
            words = [rng.choice(NAMES), "AND"] + _subject(rng) + [rng.choice(TRANSITIVE_VERBS)] + _object(rng)
            words += _optional(rng, 0.2, lambda r: ["WITH"] + _object(r))
        if MIN_WORDS <= len(words) <= MAX_WORDS:
            return " ".join(words)


def lm_sentences(count: int, held_out: set[str], seed: int) -> list[str]:
    """``count`` sentences of the grammar (repeats allowed, as in running text), none of them in ``held_out``."""
    rng = random.Random(seed + 1)  # another stream than the corpus's own sentences
    sentences: list[str] = []
    while len(sentences) < count:
        text = sentence(rng)
        if text not in held_out:
            sentences.append(text)
    return sentences


def make_splits(n_train: int, n_dev: int, n_test: int, seed: int, n_test_large: int = 0,
                n_test_unheard: int = 0) -> dict[str, list[str]]:
    """Sentences per subset (``ALL_SUBSETS``): distinct sentences throughout, dev and test only use words seen in
    train. ``test-large`` and then ``test-unheard`` are drawn last, so the other subsets do not depend on their
    sizes.

    Pure: the same arguments give the same sentences. Raises ``ValueError`` when about 100 draws per sentence
    do not find enough of them.
    """
    rng = random.Random(seed)
    seen: set[str] = set()
    splits: dict[str, list[str]] = {}
    train_words: set[str] = set()
    for subset, count in zip(ALL_SUBSETS, (n_train, n_dev, n_test, n_test_large, n_test_unheard)):
        sentences: list[str] = []
        for _ in range(100 * count + 1000):
            if len(sentences) == count:
                break
            text = sentence(rng)
            if text in seen or (subset != SUBSETS[0] and not set(text.split()) <= train_words):
                continue
            seen.add(text)
            sentences.append(text)
        if len(sentences) < count:
            raise ValueError(f"could not draw {count} new {subset} sentences (got {len(sentences)})")
        if subset == SUBSETS[0]:
            train_words = {word for text in sentences for word in text.split()}
        splits[subset] = sentences
    return splits


@dataclass(frozen=True)
class Speaker:
    """One espeak-ng voice at a speaking rate (words per minute) and pitch (0-99)."""

    id: int
    voice: str
    rate: int
    pitch: int


@dataclass(frozen=True)
class Utterance:
    """A sentence read by a speaker, filed under ``subset/speaker/chapter/speaker-chapter-index``."""

    subset: str
    speaker: Speaker
    chapter: int
    index: int
    text: str

    @property
    def id(self) -> str:
        return f"{self.speaker.id}-{self.chapter}-{self.index:04d}"

    @property
    def folder(self) -> Path:
        return Path(self.subset, str(self.speaker.id), str(self.chapter))


def make_speakers(seed: int) -> list[Speaker]:
    """One speaker per voice in ``VOICES`` (ids 101, 102, ...), with a seeded rate and pitch each."""
    rng = random.Random(f"{seed}:speakers")
    return [Speaker(101 + i, voice, rng.choice(RATES), rng.choice(PITCHES)) for i, voice in enumerate(VOICES)]


def make_unheard_speakers(seed: int) -> list[Speaker]:
    """One speaker per voice in ``UNHEARD_VOICES`` (ids after ``make_speakers``'), with a seeded rate and pitch
    each, drawn from the training speakers' ranges: only the voice is new."""
    rng = random.Random(f"{seed}:unheard-speakers")
    first = 101 + len(VOICES)
    return [Speaker(first + i, voice, rng.choice(RATES), rng.choice(PITCHES)) for i, voice in enumerate(UNHEARD_VOICES)]


def assign(splits: dict[str, list[str]], speakers: list[Speaker], seed: int,
           unheard_speakers: list[Speaker] | None = None) -> list[Utterance]:
    """Deal each subset's sentences round-robin to its speakers (``unheard_speakers`` for ``test-unheard``,
    ``speakers`` for the others); a speaker reads one or two chapters in train and one in every other subset.

    Chapter ids are unique across the corpus (1001, 1002, ...), numbered in ``ALL_SUBSETS``' order (so the
    subsets before ``test-unheard`` keep theirs whatever it holds); utterances are numbered from 1 per chapter.
    """
    rng = random.Random(f"{seed}:chapters")
    utterances: list[Utterance] = []
    next_chapter = 1001
    for subset, sentences in splits.items():
        if subset == UNHEARD_SUBSET:
            if unheard_speakers is None:
                if sentences:
                    raise ValueError(f"{len(sentences)} {UNHEARD_SUBSET} sentences and no unheard_speakers to "
                                     "read them")
                continue
            readers = unheard_speakers
        else:
            readers = speakers
        chapters = {}
        for speaker in readers:
            count = rng.choice((1, 2)) if subset == SUBSETS[0] else 1
            chapters[speaker.id] = list(range(next_chapter, next_chapter + count))
            next_chapter += len(chapters[speaker.id])
        counts: dict[int, int] = {}
        for i, text in enumerate(sentences):
            speaker = readers[i % len(readers)]
            turn = i // len(readers)
            chapter = chapters[speaker.id][turn % len(chapters[speaker.id])]
            counts[chapter] = counts.get(chapter, 0) + 1
            utterances.append(Utterance(subset, speaker, chapter, counts[chapter], text))
    return utterances


def synthesise(text: str, speaker: Speaker) -> np.ndarray:
    """espeak-ng's reading of ``text`` as float32 samples at ``SAMPLE_RATE``: ``T``."""
    command = ["espeak-ng", "--stdout", "-v", speaker.voice, "-s", str(speaker.rate), "-p", str(speaker.pitch),
               text.lower()]  # lower case: espeak-ng may spell out short all-capital words
    result = subprocess.run(command, capture_output=True)
    if result.returncode != 0 or not result.stdout:
        raise RuntimeError(f"{' '.join(command)} failed: {result.stderr.decode(errors='replace').strip()}")
    audio, rate = sf.read(io.BytesIO(result.stdout), dtype="float32", always_2d=True)
    return torchaudio.functional.resample(torch.from_numpy(audio[:, 0]), rate, SAMPLE_RATE).numpy()


def trim_silence(audio: np.ndarray, threshold_db: float = -40.0, margin_s: float = 0.05) -> np.ndarray:
    """Drop leading and trailing 10 ms frames quieter than ``threshold_db`` below the loudest frame, keeping a
    ``margin_s`` margin around the rest. ``T`` -> ``T'``."""
    frame = SAMPLE_RATE // 100
    frames = audio[: len(audio) // frame * frame].reshape(-1, frame)
    energy = (frames.astype(np.float64) ** 2).mean(axis=1)
    loud = np.flatnonzero(energy > energy.max() * 10 ** (threshold_db / 10))
    if len(loud) == 0:
        raise ValueError("silent audio")
    margin = int(margin_s * SAMPLE_RATE)
    return audio[max(0, loud[0] * frame - margin): (loud[-1] + 1) * frame + margin]


def write_flac(path: Path, audio: np.ndarray) -> None:
    """Save ``audio`` (``T`` floats in [-1, 1]) as 8-bit FLAC at highest compression, rounding without dither.

    The samples are rounded to 8 bits here and handed to libsndfile as 16-bit values with a zero low byte, which
    its 8-bit FLAC writer keeps exactly.
    """
    pcm8 = np.clip(np.rint(audio * 128), -128, 127).astype(np.int16)
    sf.write(path, pcm8 << 8, SAMPLE_RATE, format="FLAC", subtype="PCM_S8", compression_level=1.0)


def write_corpus(utterances: list[Utterance], root: Path, log_every: int) -> dict[str, float]:
    """Synthesise every utterance under ``root`` with one sorted ``.trans.txt`` per chapter; seconds per subset
    written."""
    seconds = dict.fromkeys(sorted({utterance.subset for utterance in utterances}, key=ALL_SUBSETS.index), 0.0)
    transcripts: dict[Path, list[str]] = {}
    for n, utterance in enumerate(utterances, 1):
        folder = root / utterance.folder
        folder.mkdir(parents=True, exist_ok=True)
        try:
            audio = trim_silence(synthesise(utterance.text, utterance.speaker))
        except (RuntimeError, ValueError) as error:
            raise RuntimeError(f"utterance {utterance.id} ({utterance.text!r}): {error}") from error
        write_flac(folder / f"{utterance.id}.flac", audio)
        seconds[utterance.subset] += len(audio) / SAMPLE_RATE
        transcripts.setdefault(folder, []).append(f"{utterance.id} {utterance.text}")
        if n % log_every == 0 or n == len(utterances):
            logging.info("synthesised %d/%d utterances", n, len(utterances))
    for folder, lines in transcripts.items():
        (folder / f"{folder.parent.name}-{folder.name}.trans.txt").write_text("\n".join(sorted(lines)) + "\n")
    return seconds


def folder_bytes(folder: Path) -> int:
    """Total size of the files under ``folder``."""
    return sum(path.stat().st_size for path in folder.rglob("*") if path.is_file())


def subset_seconds(folder: Path) -> float:
    """Seconds of audio in the FLAC files of one subset already written (from their headers)."""
    return sum(sf.info(str(path)).duration for path in folder.rglob("*.flac"))


def write_readme(out: Path, command: str, speakers: list[Speaker], splits: dict[str, list[str]],
                 seconds: dict[str, float], unheard_speakers: list[Speaker]) -> None:
    """``out/README.md``: how the corpus was made, its speakers, split sizes, duration and size."""
    subsets = [subset for subset in ALL_SUBSETS if splits[subset]]
    rows = "\n".join(f"| {subset} | {len(splits[subset])} | {seconds[subset] / 60:.1f} |" for subset in subsets)
    voices = "\n".join(f"| {s.id} | `{s.voice}` | {s.rate} | {s.pitch} | "
                       f"{UNHEARD_SUBSET if s in unheard_speakers else ', '.join(SUBSETS)} |"
                       for s in speakers + (unheard_speakers if splits[UNHEARD_SUBSET] else []))
    version = subprocess.run(["espeak-ng", "--version"], capture_output=True, text=True).stdout
    version = version.split("Data at")[0].strip()  # "eSpeak NG text-to-speech: 1.51"
    words = {word for sentences in splits.values() for text in sentences for word in text.split()}
    (out / "README.md").write_text(f"""# Mini LibriSpeech (synthetic)

A small synthetic speech corpus in LibriSpeech layout for the RNN-T demo, made with

    {command}

The sentences are synthetic text from the script's own grammar (upper case, no punctuation, {MIN_WORDS} to
{MAX_WORDS} words, {len(words)} distinct words), read by {version}. No dev or test sentence occurs in
train, but all their words do. Every speaker of train reads in every subset but {UNHEARD_SUBSET}, so dev,
test-mini and test-large measure new sentences from known speakers, not new speakers; {UNHEARD_SUBSET} (if
written) is read by speakers whose voices read nowhere else (espeak-ng voices no training speaker has, at rates
and pitches from the training speakers' ranges): new sentences from new voices.

Audio: 16 kHz mono FLAC, 8-bit (rounded, no dither), leading and trailing silence trimmed to a 50 ms margin.
{sum(seconds.values()) / 60:.1f} minutes, {folder_bytes(out / "LibriSpeech")} bytes in `LibriSpeech/`.

| subset | utterances | minutes |
|---|---|---|
{rows}

Each speaker is one espeak-ng voice at one speaking rate (words per minute) and pitch (0-99):

| speaker | voice | rate | pitch | reads |
|---|---|---|---|---|
{voices}
""")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=Path("recipes/librispeech/mini"),
                        help="folder for README.md and LibriSpeech/")
    parser.add_argument("--train", type=int, default=600, help="train-mini utterances")
    parser.add_argument("--dev", type=int, default=60, help="dev-mini utterances")
    parser.add_argument("--test", type=int, default=60, help="test-mini utterances")
    parser.add_argument("--test-large", type=int, default=600,
                        help="test-large utterances: more test sentences from the same speakers, whose WER varies "
                             "about a third as much by chance as test-mini's 60 do")
    parser.add_argument("--test-unheard", type=int, default=120,
                        help=f"{UNHEARD_SUBSET} utterances: held-out sentences read by the voices of "
                             f"{', '.join(UNHEARD_VOICES)}, which no other subset has (0: no such subset)")
    parser.add_argument("--subsets", default=None,
                        help=f"comma-separated subsets to (re)write into an existing OUT/LibriSpeech, leaving the "
                             f"others as they are (default: the whole corpus); e.g. --subsets {UNHEARD_SUBSET}")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--force", action="store_true",
                        help="replace an existing OUT/LibriSpeech (with --subsets: those subsets' folders)")
    parser.add_argument("--log-every", type=int, default=50, help="log progress every N utterances")
    parser.add_argument("--lm-text", type=Path, default=None,
                        help="write --lm-sentences grammar sentences (no dev or test sentence) to this file, "
                             "no audio")
    parser.add_argument("--lm-sentences", type=int, default=20000, help="sentences of --lm-text")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", stream=sys.stderr)
    splits = make_splits(args.train, args.dev, args.test, args.seed, args.test_large, args.test_unheard)
    if args.lm_text is not None:
        held_out = {text for subset in ALL_SUBSETS[1:] for text in splits[subset]}
        args.lm_text.write_text("".join(f"{text}\n" for text in lm_sentences(args.lm_sentences, held_out, args.seed)))
        logging.info("wrote %d sentences to %s", args.lm_sentences, args.lm_text)
        return

    root = args.out / "LibriSpeech"
    chosen = [subset for subset in ALL_SUBSETS if splits[subset]] if args.subsets is None else \
        [subset for subset in args.subsets.split(",") if subset]
    unknown = [subset for subset in chosen if subset not in ALL_SUBSETS or not splits[subset]]
    if unknown:
        parser.error(f"--subsets: {', '.join(unknown)} is not a subset of this corpus (its subsets: "
                     f"{', '.join(subset for subset in ALL_SUBSETS if splits[subset])})")
    if shutil.which("espeak-ng") is None:  # after the arguments' own errors, before anything is replaced
        parser.error("espeak-ng is not installed (Debian/Ubuntu: apt-get install espeak-ng)")
    if args.subsets is None:
        if root.exists():
            if not args.force:
                parser.error(f"{root} exists; pass --force to replace it")
            shutil.rmtree(root)
    else:
        missing = [subset for subset in ALL_SUBSETS if splits[subset] and subset not in chosen
                   and not (root / subset).is_dir()]
        if missing:
            parser.error(f"--subsets writes into an existing corpus, and {root} lacks {', '.join(missing)}: "
                         "write the whole corpus first (no --subsets)")
        present = [subset for subset in chosen if (root / subset).exists()]
        if present and not args.force:
            parser.error(f"{', '.join(str(root / subset) for subset in present)} exists; pass --force to replace it")
        for subset in present:
            shutil.rmtree(root / subset)

    speakers, unheard_speakers = make_speakers(args.seed), make_unheard_speakers(args.seed)
    utterances = [utterance for utterance in assign(splits, speakers, args.seed, unheard_speakers)
                  if utterance.subset in chosen]
    seconds = write_corpus(utterances, root, args.log_every)
    seconds.update({subset: subset_seconds(root / subset) for subset in ALL_SUBSETS
                    if splits[subset] and subset not in seconds})
    command = (f"python scripts/make_mini_librispeech.py --out {args.out} --train {args.train} --dev {args.dev} "
               f"--test {args.test} --test-large {args.test_large} --test-unheard {args.test_unheard} "
               f"--seed {args.seed}")
    write_readme(args.out, command, speakers, splits, seconds, unheard_speakers)
    logging.info("wrote %s: %s minutes, %d bytes", args.out, {k: round(v / 60, 1) for k, v in seconds.items()},
                 folder_bytes(args.out))


if __name__ == "__main__":
    main()
