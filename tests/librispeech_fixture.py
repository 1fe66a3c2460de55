"""A five-utterance corpus in LibriSpeech layout, written on the fly (tones and noise, not speech)."""
from pathlib import Path

import numpy as np
import soundfile as sf

SAMPLE_RATE = 16000
TRANSCRIPTS = {
    "train-fixture": {
        "19-198": ["NORTHANGER ABBEY", "THE CAT SAT ON THE MAT"],
        "26-495": ["A DOG RAN IN THE PARK TODAY"],
    },
    "test-fixture": {
        "19-227": ["THE DOG SAT IN THE PARK"],
        "26-496": ["A CAT RAN ON THE MAT"],
    },
}


def write_fixture(root: Path, seconds: float = 0.6) -> Path:
    """Write the corpus under ``root/LibriSpeech`` and return that directory."""
    corpus = root / "LibriSpeech"
    rng = np.random.default_rng(0)
    t = np.arange(int(seconds * SAMPLE_RATE)) / SAMPLE_RATE
    for subset, chapters in TRANSCRIPTS.items():
        for chapter_id, lines in chapters.items():
            speaker, chapter = chapter_id.split("-")
            directory = corpus / subset / speaker / chapter
            directory.mkdir(parents=True)
            rows = []
            for n, text in enumerate(lines):
                utterance = f"{chapter_id}-{n:04d}"
                tone = 0.3 * np.sin(2 * np.pi * (200 + 50 * len(text)) * t) + 0.05 * rng.standard_normal(t.size)
                sf.write(directory / f"{utterance}.flac", tone.astype(np.float32), SAMPLE_RATE, subtype="PCM_16")
                rows.append(f"{utterance} {text}\n")
            (directory / f"{chapter_id}.trans.txt").write_text("".join(rows))
    return corpus
