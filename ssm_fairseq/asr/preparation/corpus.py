"""A corpus in LibriSpeech's layout read subset by subset, its utterance ids checked.

``ROOT/SUBSET/SPK/CHAPTER/SPK-CHAPTER-UTT.flac`` and one ``SPK-CHAPTER.trans.txt`` per chapter. Every problem (missing
audio, an empty transcript, audio without a transcript line, a line that is not UTF-8, an id used twice in a subset,
in two subsets prepared together, or already in a manifest of the output directory under other features) becomes a
line naming the file and utterance.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ssm_fairseq.text_files import file_lines, utf8
from .manifests import prepared_ids

LIBRISPEECH_SUBSETS = ["train-clean-100", "train-clean-360", "train-other-500", "dev-clean", "dev-other",
                       "test-clean", "test-other"]


@dataclass
class Utterance:
    """One utterance of a subset: its transcript line, its FLAC and where its features go."""

    id: str
    audio: Path  # the FLAC file
    text: str
    speaker: str
    features: Path  # where its filterbanks go


class CorpusError(Exception):
    """Problems in the corpus, one line each, naming the file and utterance."""

    def __init__(self, problems: list[str]):
        super().__init__("\n".join(problems))
        self.problems = problems


def read_subset(root: Path, subset: str, out: Path) -> tuple[list[Utterance], list[str]]:
    """The utterances of ``root/subset`` in transcript order, and the problems found reading the layout."""
    directory = root / subset
    if not directory.is_dir():
        raise FileNotFoundError(f"subset {subset!r} not found: {directory} is not a directory")
    utterances, problems, transcribed = [], [], set()
    places: dict[str, list[str]] = {}  # utterance id -> every "FLAC (TRANSCRIPT:LINE)" that names it
    transcripts = sorted(directory.glob("*/*/*.trans.txt"))
    if not transcripts:
        problems.append(f"{directory}: no SPK/CHAPTER/SPK-CHAPTER.trans.txt files")
    for transcript in transcripts:
        for line_number, raw in enumerate(file_lines(transcript), 1):
            try:
                line = utf8(transcript, line_number, raw)
            except ValueError as error:
                problems.append(str(error))
                continue
            if not line.strip():
                continue
            utterance_id, _, text = line.strip().partition(" ")
            where = f"{transcript}:{line_number}: utterance {utterance_id}"
            audio = transcript.parent / f"{utterance_id}.flac"
            transcribed.add(audio)
            places.setdefault(utterance_id, []).append(f"{audio} ({transcript}:{line_number})")
            if not text.strip():
                problems.append(f"{where}: empty transcript")
            elif not audio.is_file():
                problems.append(f"{where}: audio file missing: {audio}")
            else:
                speaker = utterance_id.split("-")[0]
                utterances.append(Utterance(utterance_id, audio, " ".join(text.lower().split()), speaker,
                                            out / "fbank80" / subset / f"{utterance_id}.npy"))
    for audio in sorted(set(directory.glob("*/*/*.flac")) - transcribed):
        problems.append(f"{audio}: audio file with no line in its chapter's .trans.txt")
    shared = {utterance_id for utterance_id, named in places.items() if len(named) > 1}
    for utterance_id in sorted(shared):  # one feature file and one manifest id each: all of them are refused
        problems.append(f"utterance id {utterance_id} is used {len(places[utterance_id])} times in {subset}: "
                        f"{'; '.join(places[utterance_id])}; ids must be unique within a subset")
    return [u for u in utterances if u.id not in shared], problems


def refuse_ids_in_several_subsets(utterances: dict[str, list[Utterance]]) -> dict[str, dict[str, str]]:
    """Utterance ids that occur in more than one of the subsets prepared together: for each subset involved, each
    such id with its problem line naming every subset and recording. Such an id is the same recording in two
    subsets (training data in a test set) or two recordings under one id; either way it is left out of all."""
    where: dict[str, list[tuple[str, Path]]] = {}
    for subset, subset_utterances in utterances.items():
        for utterance in subset_utterances:
            where.setdefault(utterance.id, []).append((subset, utterance.audio))
    problems: dict[str, dict[str, str]] = {}
    for utterance_id, places in sorted(where.items()):
        if len(places) > 1:
            named = "; ".join(f"{subset}: {audio}" for subset, audio in places)
            for subset, _ in places:
                problems.setdefault(subset, {})[utterance_id] = (
                    f"utterance id {utterance_id} is in {len(places)} subsets ({named}); ids must be unique "
                    f"across the subsets prepared together (one recording in two subsets puts training data in an "
                    f"evaluation set, and a combined manifest would repeat the id)")
    return problems


def refuse_ids_prepared_before(utterances: dict[str, list[Utterance]], out: Path) -> dict[str, dict[str, str]]:
    """Utterance ids of the subsets being prepared that a manifest already in ``out`` gives to other features
    (another subset's): for each subset involved, each such id with its problem line naming the subset, the
    recording and the manifests. What ``refuse_ids_in_several_subsets`` refuses in subsets prepared together,
    refused in subsets added later (the existing manifests are left as they are). A manifest of the same subset,
    prepared before, or a ``--combine-train`` manifest holding it, names the same features: no conflict."""
    existing = prepared_ids(out)
    problems: dict[str, dict[str, str]] = {}
    for subset, subset_utterances in utterances.items():
        for utterance in subset_utterances:
            features = utterance.features.relative_to(out).as_posix()
            others = [(manifest, audio) for manifest, audio in existing.get(utterance.id, []) if audio != features]
            if others:
                named = "; ".join(f"{manifest} ({audio})" for manifest, audio in others)
                problems.setdefault(subset, {})[utterance.id] = (
                    f"utterance id {utterance.id} of {subset} ({utterance.audio}) is already in {named}; ids must be "
                    f"unique across the subsets of a data directory (one recording in two subsets puts training "
                    f"data in an evaluation set)")
    return problems


def read_subsets(root: Path, out: Path, subsets: list[str]) -> dict[str, tuple[list[Utterance], list[str]]]:
    """Each subset's utterances and problems (``read_subset``), less the ids that another subset prepared with it
    or a manifest already in ``out`` also has (listed among its problems instead)."""
    read = {subset: read_subset(root, subset, out) for subset in subsets}
    read_utterances = {s: u for s, (u, _) in read.items()}
    for refusals in (refuse_ids_in_several_subsets(read_utterances), refuse_ids_prepared_before(read_utterances, out)):
        for subset, refused in refusals.items():
            utterances, problems = read[subset]
            read[subset] = ([u for u in utterances if u.id not in refused], problems + list(refused.values()))
    return read

