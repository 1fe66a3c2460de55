"""The speech task's decoder of hypotheses and references: pieces or already-decoded text."""
from ssm_fairseq.asr.transducer.task import PiecesOrTextDecoder


class SentencePieceLike:
    """SentencePiece's decoding of space-separated pieces: join them, word boundaries become spaces."""

    def decode(self, text: str) -> str:
        return text.replace(" ", "").replace("\u2581", " ").strip()


def test_pieces_are_decoded_also_a_hypothesis_of_word_internal_pieces_only():
    # without --post-process: the reference (in pieces) comes first, then hypotheses
    decoder = PiecesOrTextDecoder(SentencePieceLike())
    assert decoder.decode("\u2581the \u2581ca t") == "the cat"
    assert decoder.decode("k d d") == "kdd"  # one word, not three
    assert decoder.decode("\u2581a b \u2581c") == "ab c"


def test_text_after_post_processing_is_left_alone():
    # with --post-process sentencepiece: fairseq has decoded every string, no word-boundary mark is left
    decoder = PiecesOrTextDecoder(SentencePieceLike())
    assert decoder.decode("the cat") == "the cat"
    assert decoder.decode("kdd") == "kdd"
    assert decoder.decode("") == ""
