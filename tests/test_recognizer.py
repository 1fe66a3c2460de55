"""``ssm_fairseq.asr``'s pieces that need no model: the decoding options' checks, and the earlier import paths kept
for one release (the recognizer and its streams are tested on trained models in ``test_transcribe.py`` and
``test_streaming_transcriber.py``)."""
from __future__ import annotations

import pytest

import ssm_fairseq.asr as asr
import ssm_fairseq.cli.transcribe as cli
import ssm_fairseq.asr.streaming_transcriber as streaming
import ssm_fairseq.transcribe as earlier
from ssm_fairseq.asr.options import DEFAULT_MAX_TOKENS, DecodingOptions


def test_the_earlier_import_paths_are_the_new_objects():
    assert earlier.Transcriber is asr.Recognizer and earlier.transcribe is asr.transcribe
    assert earlier.main is cli.main
    assert streaming.StreamInProgressError is asr.stream.StreamInProgressError
    assert streaming.ConcurrentCallError is asr.stream.ConcurrentCallError
    assert streaming.SampleRangeError is asr.samples.SampleRangeError


@pytest.mark.parametrize("options, message", [
    ({"beam": 0}, "beam must be at least 1, got 0"),
    ({"max_tokens": 0}, "max_tokens must be at least 1, got 0"),
    ({"search": "wide"}, "search must be one of"),
    ({"precision": "float8"}, "precision must be one of"),
])
def test_options_out_of_range_are_named(options, message):
    with pytest.raises(ValueError, match=message):
        DecodingOptions(**options)


def test_batches_default_to_fairseq_generates_max_tokens_unless_batch_size_alone_is_given():
    assert DecodingOptions().batch_max_tokens == DEFAULT_MAX_TOKENS
    assert DecodingOptions(batch_size=2).batch_max_tokens is None
    assert DecodingOptions(batch_size=2, max_tokens=500).batch_max_tokens == 500


def test_every_decoding_option_is_a_command_line_flag():
    """``load_recognizer`` reads each ``DecodingOptions`` field from the parsed command line."""
    args = cli.parse_args(["a.flac", "--checkpoint", "c.pt"])
    assert DecodingOptions(**{name: getattr(args, name) for name in DecodingOptions.__dataclass_fields__}) == \
        DecodingOptions()


def test_the_torch_free_search_settings_are_the_tasks_and_the_searchs():
    """``asr.options`` defines the search choices and the per-frame label limit without importing torch (the command
    line's defaults); the task and the search take theirs from there."""
    from ssm_fairseq.asr import options
    from ssm_fairseq.asr.search import hypothesis
    from ssm_fairseq.asr.transducer import task
    assert task.SEARCHES is options.SEARCHES and hypothesis.MAX_SYMBOLS_PER_FRAME is options.MAX_SYMBOLS_PER_FRAME
    assert options.PRECISIONS == {name: options.precision_dtype(name) for name in options.PRECISION_NAMES}
