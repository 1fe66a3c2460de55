"""Reference word boundaries of the mini corpus, from the synthesiser that spoke it.

The mini corpus (``scripts/make_mini_librispeech.py``) is espeak-ng reading sentences of a grammar. espeak-ng
reports, while it synthesises, the output sample at which each word and each phoneme begins (its word and phoneme
events). This script speaks every utterance of the chosen subsets again through libespeak-ng with the same voice,
rate and pitch, checks that the audio is the stored FLAC sample for sample (after the corpus's resampling,
trimming and 8-bit rounding), and writes each word's start and end in seconds from the start of the stored file:

* ``start``: the onset of the word's first phoneme;
* ``end``: the onset of whatever follows its last phoneme: the next word's first phoneme, or a pause (espeak-ng's
  ``_`` phonemes: the sentence-final pause), or the end of the audio.

Both are clamped to the stored file (``[0, duration]``: trimming may cut the start of the first phoneme's
silence-like onset). An utterance whose audio differs from the stored file (another espeak-ng version), or whose
words and word events do not pair up, stops the script with an error naming it: no boundary is written for audio
it does not describe. The output, one TSV per subset::

    id<TAB>index<TAB>word<TAB>start<TAB>end
    101-1016-0001<TAB>0<TAB>EMMA<TAB>0.000<TAB>0.192

Run from the repository root (needs espeak-ng 1.51's ``libespeak-ng.so.1``, as the corpus was made with):
``python scripts/mini_word_boundaries.py --out recipes/librispeech/mini/word_boundaries``.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import ctypes
import logging
import multiprocessing
import sys
from pathlib import Path
from typing import NamedTuple

import numpy as np
import soundfile as sf
import torch
import torchaudio

sys.path.insert(0, str(Path(__file__).resolve().parent))
import make_mini_librispeech as corpus  # noqa: E402  (a sibling script, not a package)

SYNCHRONOUS = 2  # espeak_AUDIO_OUTPUT: AUDIO_OUTPUT_SYNCHRONOUS
PHONEME_EVENTS = 0x0001  # espeakINITIALIZE_PHONEME_EVENTS
POSITION_CHARACTER = 1  # espeak_POSITION_TYPE: POS_CHARACTER
# espeak-ng's command line synthesises its text argument with these flags: espeakCHARS_AUTO | espeakPHONEMES |
# espeakENDPAUSE (the audio check below confirms they give the command line's samples)
SYNTH_FLAGS = 0x0000 | 0x0100 | 0x1000
RATE, PITCH = 1, 3  # espeak_PARAMETER: espeakRATE, espeakPITCH
UNKNOWN = "-"  # a boundary inside a group of words read as one
EVENT_END_OF_LIST, EVENT_WORD, EVENT_END, EVENT_PHONEME = 0, 1, 5, 7


class _Event(ctypes.Structure):
    """libespeak-ng's ``espeak_EVENT`` (speak_lib.h): ``sample`` is the output sample the event happens at."""

    _fields_ = [("type", ctypes.c_int), ("unique_identifier", ctypes.c_uint), ("text_position", ctypes.c_int),
                ("length", ctypes.c_int), ("audio_position", ctypes.c_int), ("sample", ctypes.c_int),
                ("user_data", ctypes.c_void_p), ("id", ctypes.c_char * 8)]


class _Voice(ctypes.Structure):
    """libespeak-ng's ``espeak_VOICE`` (speak_lib.h), to select a voice by language."""

    _fields_ = [("name", ctypes.c_char_p), ("languages", ctypes.c_char_p), ("identifier", ctypes.c_char_p),
                ("gender", ctypes.c_ubyte), ("age", ctypes.c_ubyte), ("variant", ctypes.c_ubyte),
                ("xx1", ctypes.c_ubyte), ("score", ctypes.c_int), ("spare", ctypes.c_void_p)]


_CALLBACK = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_short), ctypes.c_int, ctypes.POINTER(_Event))


class Event(NamedTuple):
    """A word (``kind`` EVENT_WORD), phoneme (EVENT_PHONEME, ``name`` its mnemonic) or end (EVENT_END) event at
    output ``sample``, for the text from character ``text_position`` (1-based)."""

    kind: int
    sample: int
    name: str
    text_position: int


class WordBoundary(NamedTuple):
    """A word of an utterance and its start and end in seconds from the start of the stored file (None: unknown,
    inside a group of words espeak-ng read as one)."""

    utterance: str
    index: int
    word: str
    start: float | None
    end: float | None


class Espeak:
    """libespeak-ng in synchronous mode: text -> int16 samples at ``sample_rate`` and the events of the reading."""

    def __init__(self, library: str = "libespeak-ng.so.1"):
        try:
            self.lib = ctypes.CDLL(library)
        except OSError as error:
            raise RuntimeError(f"cannot load {library} (Debian/Ubuntu: apt-get install espeak-ng): {error}") from error
        self.sample_rate = self.lib.espeak_Initialize(SYNCHRONOUS, 0, None, PHONEME_EVENTS)
        if self.sample_rate <= 0:
            raise RuntimeError(f"espeak_Initialize failed ({self.sample_rate})")
        self._chunks: list[np.ndarray] = []
        self._events: list[Event] = []
        self._callback = _CALLBACK(self._receive)  # kept referenced: libespeak-ng calls it
        self.lib.espeak_SetSynthCallback(self._callback)

    def _receive(self, samples, count: int, events) -> int:
        if samples and count > 0:
            self._chunks.append(np.ctypeslib.as_array(samples, (count,)).copy())
        i = 0
        while events[i].type != EVENT_END_OF_LIST:
            event = events[i]
            if event.type in (EVENT_WORD, EVENT_PHONEME, EVENT_END):
                self._events.append(Event(event.type, event.sample, bytes(event.id).split(b"\0")[0].decode(
                    "latin-1") if event.type == EVENT_PHONEME else "", event.text_position))
            i += 1
        return 0

    def speak(self, text: str, speaker: corpus.Speaker) -> tuple[np.ndarray, list[Event]]:
        """``text`` read by ``speaker`` as the corpus reads it -> (``T`` int16 samples, events in order)."""
        self._chunks, self._events = [], []
        # as the command line's -v does: a voice name, else a language (with its "+variant")
        if (self.lib.espeak_SetVoiceByName(speaker.voice.encode()) != 0
                and self.lib.espeak_SetVoiceByProperties(ctypes.byref(_Voice(languages=speaker.voice.encode()))) != 0):
            raise RuntimeError(f"espeak-ng has no voice {speaker.voice!r}")
        self.lib.espeak_SetParameter(RATE, speaker.rate, 0)
        self.lib.espeak_SetParameter(PITCH, speaker.pitch, 0)
        encoded = text.lower().encode() + b"\0"  # lower case, as make_mini_librispeech.synthesise speaks it
        if self.lib.espeak_Synth(encoded, len(encoded), 0, POSITION_CHARACTER, 0, SYNTH_FLAGS, None, None) != 0:
            raise RuntimeError(f"espeak_Synth failed on {text!r}")
        self.lib.espeak_Synchronize()
        return np.concatenate(self._chunks), list(self._events)


def word_sample_spans(words: list[str], events: list[Event], total: int
                      ) -> list[tuple[int | None, int | None]]:
    """The ``(start, end)`` output samples of each of ``words`` (the text espeak-ng read, joined by single
    spaces): from its first phoneme's onset to the onset of the event after its last phoneme (a pause, the next
    word's first phoneme, the end; ``total`` if nothing follows).

    Phonemes belong to the word event they follow; pauses (names starting with ``_``) to no word. espeak-ng reads
    some word pairs as one dictionary entry (``there was``: one word event, its phonemes not told apart); the
    boundaries inside such a group are unknown (None): its first word has a start, its last word an end. Raises
    ``ValueError`` if a word event does not start at a word, or a group has no phoneme."""
    positions = {}  # 1-based character position of each word in the text -> its index
    position = 1
    for index, word in enumerate(words):
        positions[position] = index
        position += len(word) + 1
    groups: list[tuple[int, list[int]]] = []  # (first word, indices into events of the group's phonemes)
    for i, event in enumerate(events):
        if event.kind == EVENT_WORD:
            first = positions.get(event.text_position)
            if first is None or (groups and first <= groups[-1][0]) or (not groups and first != 0):
                raise ValueError(f"a word event at character {event.text_position} starts no new word")
            groups.append((first, []))
        elif event.kind == EVENT_PHONEME and groups and not event.name.startswith("_"):
            groups[-1][1].append(i)
    if not groups or not all(phonemes for _, phonemes in groups):
        raise ValueError(f"{len(groups)} word events, {sum(1 for _, p in groups if not p)} without a phoneme")
    onsets = [e.sample for e in events]
    following = [next((onsets[j] for j in range(i + 1, len(events)) if events[j].kind != EVENT_WORD), total)
                 for i in range(len(events))]
    spans: list[tuple[int | None, int | None]] = [(None, None)] * len(words)
    lasts = [first - 1 for first, _ in groups[1:]] + [len(words) - 1]
    for (first, phonemes), last in zip(groups, lasts):
        spans[first] = (onsets[phonemes[0]], spans[first][1])
        spans[last] = (spans[last][0], following[phonemes[-1]])
    return spans


def _trim_offset(full: np.ndarray, trimmed: np.ndarray) -> int:
    """Where ``trimmed`` (a slice of ``full``, as ``trim_silence`` cuts it) starts in ``full``."""
    candidates = [int(i) for i in np.flatnonzero(full[: len(full) - len(trimmed) + 1] == trimmed[0])
                  if np.array_equal(full[i: i + len(trimmed)], trimmed)]
    if len(candidates) != 1:
        raise ValueError(f"the trimmed audio is found {len(candidates)} times in the synthesised audio")
    return candidates[0]


def speak_afresh(text: str, speaker: corpus.Speaker) -> tuple[np.ndarray, list[Event], int]:
    """``Espeak().speak(text, speaker)`` and the sample rate, in a process that has not spoken before.

    libespeak-ng keeps state from one text to the next (the second reading of a sentence comes out a few samples
    shorter than the first), and the command line that made the corpus started afresh for every utterance."""
    context = multiprocessing.get_context("fork")
    with concurrent.futures.ProcessPoolExecutor(1, mp_context=context) as worker:
        return worker.submit(_speak, text, speaker).result()


def _speak(text: str, speaker: corpus.Speaker) -> tuple[np.ndarray, list[Event], int]:
    espeak = Espeak()
    return (*espeak.speak(text, speaker), espeak.sample_rate)


def utterance_boundaries(utterance: corpus.Utterance, stored: Path) -> list[WordBoundary]:
    """One utterance's word boundaries in its stored file; ``ValueError`` if the synthesis is not that file."""
    samples, events, sample_rate = speak_afresh(utterance.text, utterance.speaker)
    # make_mini_librispeech.synthesise: the command line's WAV read as float32, resampled to 16 kHz
    full = torchaudio.functional.resample(torch.from_numpy(samples.astype(np.float32) / 32768),
                                          sample_rate, corpus.SAMPLE_RATE).numpy()
    trimmed = corpus.trim_silence(full)
    pcm8 = np.clip(np.rint(trimmed * 128), -128, 127).astype(np.int16)
    audio, rate = sf.read(stored, dtype="int16")
    if rate != corpus.SAMPLE_RATE or not np.array_equal(audio >> 8, pcm8):
        raise ValueError(f"{stored}: espeak-ng's reading of {utterance.text!r} is not this file's audio "
                         f"({len(pcm8)} against {len(audio)} samples): another espeak-ng version?")
    offset = _trim_offset(full, trimmed) / corpus.SAMPLE_RATE
    duration = len(audio) / corpus.SAMPLE_RATE
    words = utterance.text.split()

    def seconds(sample: int | None) -> float | None:
        return None if sample is None else min(max(sample / sample_rate - offset, 0.0), duration)

    return [WordBoundary(utterance.id, i, word, seconds(start), seconds(end))
            for i, (word, (start, end)) in enumerate(zip(words, word_sample_spans(words, events, len(samples))))]


def _seconds(t: float | None) -> str:
    return UNKNOWN if t is None else f"{t:.3f}"


def read_boundaries(path: Path) -> dict[str, list[WordBoundary]]:
    """A TSV this script wrote -> each utterance's words in order. ``ValueError`` naming the line otherwise."""
    utterances: dict[str, list[WordBoundary]] = {}
    lines = path.read_text().splitlines()
    if not lines or lines[0].split("\t") != list(WordBoundary._fields):
        raise ValueError(f"{path}:1: header {chr(9).join(WordBoundary._fields)!r} expected")
    for number, line in enumerate(lines[1:], start=2):
        fields = line.split("\t")
        try:
            utterance, index, word, start, end = fields
            boundary = WordBoundary(utterance, int(index), word, *(None if t == UNKNOWN else float(t)
                                                                   for t in (start, end)))
        except ValueError as error:
            raise ValueError(f"{path}:{number}: not id, index, word, start, end: {line!r}") from error
        words = utterances.setdefault(utterance, [])
        known = [t for t in (boundary.start, boundary.end) if t is not None]
        if boundary.index != len(words) or any(t < 0 for t in known) or known != sorted(known):
            raise ValueError(f"{path}:{number}: word {boundary.index} out of order or with start after end")
        words.append(boundary)
    return utterances


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--corpus", type=Path, default=Path("recipes/librispeech/mini/LibriSpeech"),
                        help="the mini corpus's LibriSpeech folder")
    parser.add_argument("--out", type=Path, required=True, help="folder for SUBSET.tsv")
    parser.add_argument("--subsets", nargs="+", default=["dev-mini", "test-mini", "test-large"],
                        choices=corpus.SUBSETS)
    parser.add_argument("--train", type=int, default=600, help="the corpus's --train (sentences are drawn in turn)")
    parser.add_argument("--dev", type=int, default=60)
    parser.add_argument("--test", type=int, default=60)
    parser.add_argument("--test-large", type=int, default=600)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", stream=sys.stderr)
    splits = corpus.make_splits(args.train, args.dev, args.test, args.seed, args.test_large)
    utterances = corpus.assign(splits, corpus.make_speakers(args.seed), args.seed)
    args.out.mkdir(parents=True, exist_ok=True)
    for subset in args.subsets:
        rows = ["\t".join(WordBoundary._fields)]
        chosen = sorted((u for u in utterances if u.subset == subset), key=lambda u: u.id)
        for utterance in chosen:
            stored = args.corpus / utterance.folder / f"{utterance.id}.flac"
            try:
                boundaries = utterance_boundaries(utterance, stored)
            except (RuntimeError, ValueError) as error:
                parser.exit(1, f"error: utterance {utterance.id} ({utterance.text!r}): {error}\n")
            rows += ["\t".join([b.utterance, str(b.index), b.word, _seconds(b.start), _seconds(b.end)])
                     for b in boundaries]
        (args.out / f"{subset}.tsv").write_text("\n".join(rows) + "\n")
        logging.info("%s: %d utterances, %d words -> %s", subset, len(chosen), len(rows) - 1,
                     args.out / f"{subset}.tsv")


if __name__ == "__main__":
    main()
