"""Endpoints: where a stream's segment ends, from the search's own decisions (blank frames), not from the audio's
energy.

A transducer emits blank at every encoder frame where it hears nothing new to write; after the last label of a
sentence, its best hypothesis gathers blank frames for as long as the speaker pauses. ``EndpointRules`` turns those
counts into an endpoint: the segment ends, the stream's search (and its language model's context) starts afresh,
and the encoder carries on with its state. Three rules, each in seconds of audio (an encoder frame is the
sub-sampling stride x 10 ms, 40 ms for this package's models), any of which ends a segment:

1. ``silence_without_speech``: the segment has no label yet and has lasted this long (default 2.4 s). Nothing is
   written for it; it only keeps the search from carrying a long silence into the next sentence.
2. ``silence_after_speech``: the segment has labels, and the best hypothesis has emitted only blanks for this
   long since its last label (default 0.8 s).
3. ``max_segment``: the segment has lasted this long, whatever it holds (default 20 s): bounds the work and the
   memory a search (and an LM context) can accumulate, and the length of a subtitle.

The rules and their units are those of the endpointing of icefall's and sherpa's streaming decoders; rules 1 and 3
keep their defaults (2.4 s, 20 s), rule 2 is shorter than their 1.2 s. Measured with the mini recipe's streaming
model (``checkpoint_avg3.pt``, beam 4, 320 ms chunks) on the 60 test-mini utterances joined three by three with
pauses of faint noise (WER of the joined transcripts; 24.8% decoded one by one):

    pause   no endpoints   rule 2 = 0.8 s          rule 2 = 1.2 s
    1.0 s   67.3%          54.5% (67 segments)     59.3% (55 segments)
    0.5 s   64.7%          50.4% (57 segments)     55.0% (47 segments)

(60 sentences each time.) An endpoint sooner after a sentence restarts the search sooner, which is what the
models of this package, trained on single sentences, need (issue 50); on test-mini joined with 1 to 2 s pauses,
0.8 s put every endpoint inside a pause, 1.2 s two of 12 up to 0.2 s into the next sentence (emissions lag the
sound). After a pause shorter than rule 2 plus that lag, the endpoint falls inside the next sentence either way.
Speech slower than read speech may need 1.2 s (``--endpoint-silence-after-speech``).

A search restarted in a pause may emit a sentence's usual first word at once, before any speech (the causal
model's sentence-initial prior, issue 50). A stream drops a segment after an endpoint whose labels all came at its
first frame (``Stream``): mid-training, the mini model otherwise gave 6 segments of such words in 10 s of digital
silence after a sentence. A search that is not restarted stays quiet in pauses, but restarting it only when it
emits again (tried) lost whole sentences: with the first sentence as its context, it did not wake up for the next.

The encoder carries its state across endpoints unless ``reset_encoder``: models trained on single sentences
transcribe the next sentence better from a fresh state. On the joined test-mini above (1 s pauses, rule 2 at
0.8 s), resetting it brought the WER from 54.5% to 44.3% (1.2 s: from 59.3% to 50.6%); still far from the 24.8% of
the sentences one by one (the first word of each restarted search is mostly the model's prior guess).

Segments are cut at the encoder frames the stream has been given: a stream checks the rules after each chunk, so
an endpoint falls up to one chunk after the rule's time. ``split_words`` applies rules 2 and 3 to a transcript's
timed words (offline transcription, which has no search to restart). A stream counts rule 2's silence in blank
frames after the last label's emission frame, while a timed word reaches over up to ``TAIL_FRAMES`` blank frames
after it and the next word back over up to ``LEAD_FRAMES`` before its own (``search.word_timestamps``): the gap
between two timed words is the blank run less those ``LEAD_FRAMES + TAIL_FRAMES`` frames (240 ms at 40 ms a
frame), so ``split_words`` adds them back, at the model's frame duration, and cuts where a stream stepped frame by
frame would (``silence_after_speech`` after the last emission frame; measured in the wrong unit, offline cut only
after 1.04 s of blanks).

Pauses in the audio (``pause_seconds``): the stream's counterpart of offline ``--split-at-pauses``
(``pause_segments``). Each filterbank frame is tested for quiet as it arrives (``pause_segments.CausalQuietness``:
the offline test with the levels seen so far); the frames of a quiet run are held back from the encoder, and when
the run reaches ``pause_seconds`` the segment ends at the run's start (its encoder finished on the frames before,
as an utterance's is), the quiet run is dropped (offline, keeping none of a pause measured best), and the encoder
and search start afresh at the next frame that is not quiet: each segment is decoded as an utterance would be on
its own. A quiet run shorter than that is fed to the encoder when sound resumes (the partial transcript waits for
it: at most ``pause_seconds``). ``blank_rules=False`` keeps only rule 3 (and the pauses) of the rules above.
Measured with the same model and recordings as above (``scripts/benchmarks/pause_endpoints.py``, 1 s pauses,
320 ms chunks, beam 4; one model, one run), WER of the joined transcripts:

    subset      one by one   no endpoints   rule 2 (0.8 s)   rule 2 + encoder reset   pauses of 0.5 s (0.3 s)
    test-mini   24.81%       66.75%         51.15%           45.27%                   29.67% (29.67%), 60 segments
    test-large  23.31%                                                                26.98%, 600 segments

Pauses found every sentence boundary, but the sentences after a pause lose more than the first (test-mini:
27.6% and 28.4% WER in 2nd and 3rd place against 19.7% and 22.4% one by one, 33.9% against 32.3% first);
feeding the pause's last 0.1 s before them made it worse (``stream.PAUSE_PRE_ROLL``).

Pure Python (no torch): the command line imports it before it knows whether it needs torch.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

from .search.word_timestamps import LEAD_FRAMES, TAIL_FRAMES
from .transcripts import Segment, TimedWordLike

DEFAULT_SILENCE_WITHOUT_SPEECH = 2.4  # seconds: rule 1
DEFAULT_SILENCE_AFTER_SPEECH = 0.8  # seconds: rule 2
DEFAULT_MAX_SEGMENT = 20.0  # seconds: rule 3


@dataclass(frozen=True)
class EndpointRules:
    """The three endpoint rules (see the module docstring), in seconds; ``ValueError`` for a value that is not a
    positive finite number. ``reset_encoder``: at each endpoint the encoder starts afresh too, as for a new
    utterance (off: it carries its state on). ``pause_seconds``: also end a segment at every stretch of quiet audio
    this long, dropped, the encoder restarted after it (None: off; see the module docstring); ``blank_rules``:
    apply rules 1 and 2 (off: only rule 3 and the pauses, which need ``pause_seconds``)."""

    silence_without_speech: float = DEFAULT_SILENCE_WITHOUT_SPEECH
    silence_after_speech: float = DEFAULT_SILENCE_AFTER_SPEECH
    max_segment: float = DEFAULT_MAX_SEGMENT
    reset_encoder: bool = False
    pause_seconds: float | None = None
    blank_rules: bool = True

    def __post_init__(self):
        pause = self.pause_seconds
        if pause is not None and (isinstance(pause, bool) or not isinstance(pause, (int, float))
                                  or not (math.isfinite(pause) and pause > 0)):
            raise ValueError(f"endpoint pause_seconds must be a positive number of seconds, got {pause!r}")
        if not self.blank_rules and pause is None:
            raise ValueError("endpoints without the blank rules (blank_rules=False) need pause_seconds")
        for name in ("silence_without_speech", "silence_after_speech", "max_segment"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not (math.isfinite(value)
                                                                                     and value > 0):
                raise ValueError(f"endpoint rule {name} must be a positive number of seconds, got {value!r}")

    def rule(self, segment_seconds: float, trailing_blank_seconds: float, has_speech: bool) -> int | None:
        """Which rule ends a segment of ``segment_seconds`` whose best hypothesis ends with
        ``trailing_blank_seconds`` of blank frames (the whole segment if it has no label; ``has_speech``: it has
        some): 1, 2 or 3, or None (the segment goes on). Rule 3 is checked last: a segment that ends at a pause
        ends by rule 1 or 2."""
        if self.blank_rules and not has_speech and trailing_blank_seconds >= self.silence_without_speech:
            return 1
        if self.blank_rules and has_speech and trailing_blank_seconds >= self.silence_after_speech:
            return 2
        if segment_seconds >= self.max_segment:
            return 3
        return None


def split_words(words: Sequence[TimedWordLike], duration: float, rules: EndpointRules, text: str | None = None, *,
                frame_seconds: float) -> list[Segment]:
    """A transcript's timed words over ``[0, duration]`` seconds -> its segments, cut by rules 2 and 3 as a stream
    would cut them: after a word whose last emission frame is followed by at least ``silence_after_speech`` of
    blank frames (the segment ends that long after that frame, which is never after the next word's first emission
    frame; a next word whose time reaches back over the cut starts at the cut, as a stream's segment keeps its
    words inside it), and before a word that would end more than ``max_segment`` after its segment's start (the
    segment ends where that word starts). A segment's text is its words joined by spaces.

    ``frame_seconds``: the model's encoder frame (``Recognizer.frame_seconds``): the words were timed by
    ``search.word_timestamps``, whose leads and tails of blank frames (``LEAD_FRAMES``, ``TAIL_FRAMES``) hide that
    much of each pause between words; the blank run after a word is the gap to the next word plus them (words that
    touch had at most that many blank frames between them: no cut for a ``silence_after_speech`` that short).

    Segments cover ``[0, duration]`` without gap or overlap, in order; with no word, one segment holding
    ``text`` (default ``""``). ``text``: the transcript, when it is not only its words joined by spaces, is kept
    whole if there is no cut."""
    if not (isinstance(frame_seconds, (int, float)) and math.isfinite(frame_seconds) and frame_seconds > 0):
        raise ValueError(f"frame_seconds must be a positive number of seconds, got {frame_seconds!r}")
    lead, tail = LEAD_FRAMES * frame_seconds, TAIL_FRAMES * frame_seconds
    tolerance = 1e-6 * frame_seconds  # times are frame counts times frame_seconds: rounding only
    words = list(words)
    if not words:
        return [Segment(0.0, duration, text or "", [])]
    groups: list[list] = [[words[0]]]
    bounds = [0.0]
    for previous, word in zip(words, words[1:]):
        start = bounds[-1]
        gap = word[1] - previous[2]
        if gap > tolerance and gap + lead + tail >= rules.silence_after_speech - tolerance:
            bounds.append(previous[2] - tail + rules.silence_after_speech)
            word = _starting_at(word, bounds[-1])
        elif word[2] - start > rules.max_segment:
            bounds.append(word[1])
        else:
            groups[-1].append(word)
            continue
        groups.append([word])
    bounds.append(duration)
    if len(groups) == 1 and text is not None:
        return [Segment(0.0, duration, text, words)]
    return [Segment(start, max(start, end), " ".join(w[0] for w in group), group)
            for start, end, group in zip(bounds, bounds[1:], groups)]


def _starting_at(word: TimedWordLike, start: float) -> TimedWordLike:
    """``word`` starting no sooner than ``start`` (its own type: a ``TimedWord`` or a plain tuple)."""
    if word[1] >= start:
        return word
    return word._replace(start=start) if hasattr(word, "_replace") else (word[0], start, word[2])
