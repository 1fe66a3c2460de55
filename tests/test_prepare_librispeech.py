"""scripts/prepare_librispeech.py on a five-utterance corpus in LibriSpeech layout."""
import csv
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
import sentencepiece as spm
import yaml

from librispeech_fixture import SAMPLE_RATE, TRANSCRIPTS, write_fixture

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))  # the feature processes import it too
import prepare_librispeech  # noqa: E402

SUBSETS = ["train-fixture", "test-fixture"]


def run(corpus: Path, out: Path, *extra: str, jobs: int = 1) -> int:
    return prepare_librispeech.main(["--librispeech-root", str(corpus), "--out", str(out), "--subsets",
                                     ",".join(SUBSETS), "--vocab-size", "24", "--jobs", str(jobs), *extra])


def read_manifest(path: Path) -> list[dict]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE))


def test_features_manifests_sentencepiece_and_config(tmp_path):
    corpus, out = write_fixture(tmp_path), tmp_path / "data"
    assert run(corpus, out, "--combine-train", "train-all", jobs=2) == 0  # two feature processes
    for subset in SUBSETS:
        rows = read_manifest(out / f"{subset}.tsv")
        expected = {f"{chapter}-{n:04d}": text.lower() for chapter, lines in TRANSCRIPTS[subset].items()
                    for n, text in enumerate(lines)}
        assert {row["id"]: row["tgt_text"] for row in rows} == expected
        for row in rows:
            features = np.load(out / row["audio"])
            frames = (int(0.6 * SAMPLE_RATE) - 400) // 160 + 1  # 25 ms windows every 10 ms
            assert features.shape == (frames, 80) and features.dtype == np.float32
            assert int(row["n_frames"]) == frames and np.isfinite(features).all()
            assert row["speaker"] == row["id"].split("-")[0]
    assert len(read_manifest(out / "train-all.tsv")) == 3
    config = yaml.safe_load((out / "config.yaml").read_text())
    assert config["input_feat_per_channel"] == 80
    assert config["feature_transforms"]["_train"] == ["utterance_cmvn", "specaugment"]
    model = spm.SentencePieceProcessor(model_file=str(out / config["bpe_tokenizer"]["sentencepiece_model"]))
    assert [model.id_to_piece(i) for i in range(4)] == ["<s>", "<pad>", "</s>", "<unk>"]
    dictionary = (out / config["vocab_filename"]).read_text().splitlines()
    assert [line.split()[0] for line in dictionary] == [model.id_to_piece(i) for i in range(4, len(model))]
    assert model.decode(model.encode("the cat ran in the park")) == "the cat ran in the park"


def test_second_run_resumes_without_recomputing(tmp_path):
    corpus, out = write_fixture(tmp_path), tmp_path / "data"
    assert run(corpus, out) == 0
    stored = sorted((out / "fbank80").rglob("*.npy"))
    stamps = [path.stat().st_mtime_ns for path in stored]
    stored[0].write_bytes(b"cut short")  # as an interrupted write would leave it
    assert run(corpus, out) == 0
    assert [p.stat().st_mtime_ns for p in stored[1:]] == stamps[1:]
    assert np.load(stored[0]).shape[1] == 80


@pytest.mark.parametrize("damage, named", [
    ("missing", "audio file missing"),
    ("empty transcript", "empty transcript"),
    ("unreadable", "unreadable audio"),
])
def test_bad_utterances_are_named(tmp_path, caplog, damage, named):
    corpus, out = write_fixture(tmp_path), tmp_path / "data"
    chapter = corpus / "train-fixture" / "19" / "198"
    victim = chapter / "19-198-0001.flac"
    if damage == "missing":
        victim.unlink()
    elif damage == "empty transcript":
        transcript = chapter / "19-198.trans.txt"
        transcript.write_text(transcript.read_text().replace("THE CAT SAT ON THE MAT", ""))
    else:
        victim.write_bytes(b"not a flac file at all")
    assert run(corpus, out) == 1
    errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert any(named in message and "19-198-0001" in message for message in errors), errors
    assert not (out / "train-fixture.tsv").exists()
    # With --skip-bad the other utterances go through and the bad one is listed, not silently lost.
    assert run(corpus, out, "--skip-bad") == 0
    assert [row["id"] for row in read_manifest(out / "train-fixture.tsv")] == ["19-198-0000", "26-495-0000"]
    assert "19-198-0001" in (out / "train-fixture.rejected.tsv").read_text()


def test_missing_subset_is_named(tmp_path, caplog):
    corpus = write_fixture(tmp_path)
    assert prepare_librispeech.main(["--librispeech-root", str(corpus), "--out", str(tmp_path / "d"),
                                     "--subsets", "dev-clean"]) == 1
    assert any("dev-clean" in r.getMessage() for r in caplog.records)


def test_quotes_and_any_utf8_round_trip_through_fairseqs_manifest_reader(tmp_path):
    from fairseq.data.audio.speech_to_text_dataset import SpeechToTextDatasetCreator

    corpus, out = write_fixture(tmp_path), tmp_path / "data"
    transcript = corpus / "test-fixture/19/227/19-227.trans.txt"
    text = 'THE "DOG" SAID \'NO\' — ÇA VA, 狗'
    transcript.write_text(f"19-227-0000 {text}\n", encoding="utf-8")
    assert run(corpus, out) == 0
    rows = SpeechToTextDatasetCreator._load_samples_from_tsv(str(out), "test-fixture")
    assert {row["id"]: row["tgt_text"] for row in rows}["19-227-0000"] == text.lower()
    assert not list(out.glob("*.partial.tsv"))


def test_other_rates_and_channels_are_resampled_and_downmixed(tmp_path, caplog):
    import soundfile as sf
    import torch
    import torchaudio.functional

    from ssm_fairseq.asr.features.audio_features import log_mel_filterbank

    corpus, out = write_fixture(tmp_path), tmp_path / "data"
    flac = corpus / "test-fixture/26/496/26-496-0000.flac"
    mono, rate = sf.read(flac, dtype="float32")
    reference = log_mel_filterbank(mono, rate)
    stereo = torchaudio.functional.resample(torch.from_numpy(mono), rate, 44100).numpy()
    sf.write(flac, np.stack([stereo, stereo], axis=1), 44100, subtype="PCM_24")
    with caplog.at_level("INFO"):
        assert run(corpus, out) == 0
    assert "1 utterances not 16 kHz mono: 2 channels downmixed, resampled from 44100 Hz" in caplog.text
    features = np.load(out / "fbank80/test-fixture/26-496-0000.npy")
    assert features.shape == reference.shape
    # the mel axis is LibriSpeech's: the same filterbanks up to resampling error (log energies, nats)
    assert np.median(np.abs(features - reference)) < 0.1


def test_an_utterance_id_used_in_two_chapters_is_refused_naming_both(tmp_path, caplog):
    corpus, out = write_fixture(tmp_path), tmp_path / "data"
    first = corpus / "train-fixture/19/198/19-198-0001.flac"
    other_chapter = corpus / "train-fixture/26/495"
    second = other_chapter / first.name  # another recording under the same id
    second.write_bytes((other_chapter / "26-495-0000.flac").read_bytes())
    with open(other_chapter / "26-495.trans.txt", "a") as transcript:
        transcript.write("19-198-0001 A DOG RAN IN THE PARK TODAY\n")
    assert run(corpus, out) == 1
    errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert any("19-198-0001" in m and str(first) in m and str(second) in m for m in errors), errors
    assert not (out / "train-fixture.tsv").exists()
    # --skip-bad leaves both out (which transcript goes with which recording is unknown) and lists them.
    assert run(corpus, out, "--skip-bad") == 0
    assert [row["id"] for row in read_manifest(out / "train-fixture.tsv")] == ["19-198-0000", "26-495-0000"]
    assert str(second) in (out / "train-fixture.rejected.tsv").read_text()


def test_a_replaced_recording_is_featurised_again(tmp_path):
    from ssm_fairseq.asr.features.audio_features import filterbank_features

    corpus, out = write_fixture(tmp_path), tmp_path / "data"
    assert run(corpus, out) == 0
    chapter = corpus / "test-fixture/26/496"
    longer = write_fixture(tmp_path / "longer", seconds=1.0) / "test-fixture/19/227/19-227-0000.flac"
    longer.replace(chapter / "26-496-0000.flac")
    (chapter / "26-496.trans.txt").write_text("26-496-0000 THE DOG SAT IN THE PARK\n")
    assert run(corpus, out) == 0
    row = {r["id"]: r for r in read_manifest(out / "test-fixture.tsv")}["26-496-0000"]
    expected, _ = filterbank_features(chapter / "26-496-0000.flac")
    assert row["tgt_text"] == "the dog sat in the park" and int(row["n_frames"]) == expected.shape[0]
    assert np.array_equal(np.load(out / row["audio"]), expected)


def test_a_zero_byte_feature_file_is_recomputed(tmp_path):
    corpus, out = write_fixture(tmp_path), tmp_path / "data"
    assert run(corpus, out) == 0
    victim = out / "fbank80/train-fixture/19-198-0000.npy"
    expected = np.load(victim)
    victim.write_bytes(b"")  # as a crash can leave it
    assert run(corpus, out, jobs=2) == 0
    assert np.array_equal(np.load(victim), expected)


def test_other_training_subsets_do_not_replace_the_vocabulary(tmp_path, caplog):
    corpus, out = write_fixture(tmp_path), tmp_path / "data"
    assert run(corpus, out, "--train-subsets", "train-fixture") == 0
    files = [out / "spm_unigram24.model", out / "spm_unigram24.txt"]
    vocabulary = {path: path.read_bytes() for path in files}
    assert run(corpus, out, "--train-subsets", "train-fixture") == 0  # the same inputs again: a resume
    assert {path: path.read_bytes() for path in files} == vocabulary
    caplog.clear()
    assert run(corpus, out, "--train-subsets", "train-fixture,test-fixture") == 1
    errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert len(errors) == 1 and str(out / "spm_unigram24.model") in errors[0], errors
    assert "--overwrite-vocabulary" in errors[0] and "new --out" in errors[0]
    assert {path: path.read_bytes() for path in files} == vocabulary
    caplog.clear()
    assert prepare_librispeech.main(["--librispeech-root", str(corpus), "--out", str(out), "--subsets",
                                     ",".join(SUBSETS), "--vocab-size", "26", "--jobs", "1"]) == 1
    assert any(str(out / "spm_unigram24.txt") in r.getMessage() for r in caplog.records)
    assert yaml.safe_load((out / "config.yaml").read_text())["vocab_filename"] == "spm_unigram24.txt"
    assert run(corpus, out, "--train-subsets", "train-fixture,test-fixture", "--overwrite-vocabulary") == 0
    assert (out / "spm_unigram24.txt").read_bytes() != vocabulary[out / "spm_unigram24.txt"]


def test_a_vocabulary_smaller_than_the_character_set_is_named(tmp_path, caplog):
    corpus, out = write_fixture(tmp_path), tmp_path / "data"
    assert prepare_librispeech.main(["--librispeech-root", str(corpus), "--out", str(out), "--subsets",
                                     ",".join(SUBSETS), "--vocab-size", "8", "--jobs", "1"]) == 1
    errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert len(errors) == 1 and errors[0].startswith("--vocab-size 8 is too small"), errors
    minimum = int(errors[0].split("use --vocab-size ")[1].split()[0])
    assert prepare_librispeech.main(["--librispeech-root", str(corpus), "--out", str(out), "--subsets",
                                     ",".join(SUBSETS), "--vocab-size", str(minimum), "--jobs", "1"]) == 0
    assert prepare_librispeech.main(["--librispeech-root", str(corpus), "--out", str(tmp_path / "d2"),
                                     "--subsets", ",".join(SUBSETS), "--vocab-size", str(minimum - 1),
                                     "--jobs", "1"]) == 1


def test_a_transcript_line_that_is_not_utf8_is_named(tmp_path, caplog):
    corpus, out = write_fixture(tmp_path), tmp_path / "data"
    transcript = corpus / "test-fixture/19/227/19-227.trans.txt"
    transcript.write_bytes(b"19-227-0000 CAF\xe9 AU LAIT\n")  # Latin-1
    assert run(corpus, out) == 1
    errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert any(m.startswith(f"{transcript}:1: not UTF-8") for m in errors), errors


def test_an_utterance_id_in_two_subsets_is_refused_naming_both(tmp_path, caplog):
    corpus, out = write_fixture(tmp_path), tmp_path / "data"
    in_training = corpus / "train-fixture/19/198/19-198-0001.flac"
    chapter = corpus / "test-fixture" / in_training.parent.relative_to(corpus / "train-fixture")
    chapter.mkdir(parents=True)
    in_test = chapter / in_training.name  # the same recording again, in the test subset
    in_test.write_bytes(in_training.read_bytes())
    (chapter / "19-198.trans.txt").write_text("19-198-0001 A DOG RAN IN THE PARK TODAY\n")
    assert run(corpus, out) == 1
    errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert any("19-198-0001 is in 2 subsets" in m and str(in_training) in m and str(in_test) in m
               for m in errors), errors
    assert not (out / "train-fixture.tsv").exists()
    # --skip-bad leaves it out of both subsets and lists it in both rejected lists.
    assert run(corpus, out, "--skip-bad") == 0
    for subset in SUBSETS:
        assert "19-198-0001" not in {row["id"] for row in read_manifest(out / f"{subset}.tsv")}
        assert str(in_test) in (out / f"{subset}.rejected.tsv").read_text()


def test_a_changed_data_configuration_is_reported(tmp_path, caplog):
    corpus, out = write_fixture(tmp_path), tmp_path / "data"
    assert run(corpus, out) == 0 and run(corpus, out) == 0
    assert not [r for r in caplog.records if "config.yaml: replacing" in r.getMessage()]
    assert run(corpus, out, "--no-specaugment") == 0
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert any(f"{out}/config.yaml: replacing" in m and "feature_transforms, specaugment" in m for m in warnings)
    assert "specaugment" not in yaml.safe_load((out / "config.yaml").read_text())


def test_global_cmvn_statistics_of_the_training_subsets_in_the_config(tmp_path, monkeypatch):
    from fairseq.data.audio.feature_transforms import CompositeAudioFeatureTransform
    from fairseq.data.audio.feature_transforms.global_cmvn import GlobalCMVN

    from ssm_fairseq.asr.transducer.data_config import DataDirectoryConfig

    corpus, out = write_fixture(tmp_path), tmp_path / "data"
    assert run(corpus, out, "--cmvn", "global") == 0
    config = yaml.safe_load((out / "config.yaml").read_text())
    assert config["feature_transforms"] == {"_train": ["global_cmvn", "specaugment"], "*": ["global_cmvn"]}
    assert config["global_cmvn"] == {"stats_npz_path": "gcmvn.npz"} and config["audio_root"] == "."  # relative
    stats = np.load(out / "gcmvn.npz")
    assert sorted(stats.files) == ["mean", "std"]
    assert all(stats[key].dtype == np.float32 and stats[key].shape == (80,) for key in stats.files)
    training = [np.load(out / row["audio"]) for row in read_manifest(out / "train-fixture.tsv")]
    frames = np.concatenate(training).astype(np.float64)
    np.testing.assert_allclose(stats["mean"], frames.mean(axis=0), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(stats["std"], frames.std(axis=0), rtol=1e-5)
    test = np.concatenate([np.load(out / row["audio"]) for row in read_manifest(out / "test-fixture.tsv")])
    assert not np.allclose(stats["mean"], np.concatenate([frames, test]).mean(axis=0), atol=1e-3)  # training only
    # fairseq's own transform, built from config.yaml as the task reads it in another working directory, normalises
    # the training frames
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    data_cfg = DataDirectoryConfig(out / "config.yaml")
    assert data_cfg.audio_root == str(out)
    assert isinstance(CompositeAudioFeatureTransform.from_config_dict(
        data_cfg.get_feature_transforms("train-fixture", True)).transforms[0], GlobalCMVN)
    transform = CompositeAudioFeatureTransform.from_config_dict(data_cfg.get_feature_transforms("test-fixture", False))
    normalised = np.concatenate([transform(features) for features in training])
    assert np.abs(normalised.mean(axis=0)).max() < 1e-4 and np.abs(normalised.std(axis=0) - 1).max() < 1e-4


def test_adaptive_cmvn_follows_global_cmvn_in_the_config(tmp_path, caplog):
    """``--cmvn adaptive``: the training set's statistics and global CMVN, then ``adaptive_cmvn`` with the prior of
    ``--cmvn-prior-frames``, in training and evaluation; the transform fairseq builds from the config is each
    utterance's running CMVN after global CMVN; switching to or from it is refused as any other CMVN change."""
    from fairseq.data.audio.feature_transforms import CompositeAudioFeatureTransform

    from ssm_fairseq.asr.features.adaptive_cmvn import RunningCMVN
    from ssm_fairseq.asr.transducer.data_config import DataDirectoryConfig

    corpus, out = write_fixture(tmp_path), tmp_path / "data"
    assert run(corpus, out, "--cmvn", "adaptive", "--cmvn-prior-frames", "50") == 0
    config = yaml.safe_load((out / "config.yaml").read_text())
    assert config["feature_transforms"] == {"_train": ["global_cmvn", "adaptive_cmvn", "specaugment"],
                                            "*": ["global_cmvn", "adaptive_cmvn"]}
    assert config["adaptive_cmvn"] == {"prior_frames": 50} and config["global_cmvn"] == {"stats_npz_path": "gcmvn.npz"}
    stats = np.load(out / "gcmvn.npz")
    features = np.load(out / read_manifest(out / "test-fixture.tsv")[0]["audio"])
    transform = CompositeAudioFeatureTransform.from_config_dict(
        DataDirectoryConfig(out / "config.yaml").get_feature_transforms("test-fixture", False))
    expected = RunningCMVN(50)((features - stats["mean"]) / stats["std"])
    np.testing.assert_allclose(transform(features), expected, rtol=1e-5, atol=1e-5)
    assert not np.allclose(transform(features), (features - stats["mean"]) / stats["std"], atol=1e-2)
    caplog.clear()
    assert run(corpus, out, "--cmvn", "global") == 1
    errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert len(errors) == 1 and "--cmvn global" in errors[0] and "uses adaptive CMVN" in errors[0]
    assert run(corpus, out, "--cmvn", "adaptive", "--cmvn-prior-frames", "-1") == 1  # refused, named
    assert "prior_frames must be a number of frames >= 0" in caplog.records[-1].getMessage()


def test_a_config_of_an_earlier_release_with_absolute_paths_is_no_change(tmp_path, caplog):
    """An earlier release wrote ``audio_root`` and the statistics as absolute paths: preparing again rewrites them
    relative to the directory, without the warning for a changed data configuration."""
    corpus, out = write_fixture(tmp_path), tmp_path / "data"
    assert run(corpus, out, "--cmvn", "global") == 0
    config = yaml.safe_load((out / "config.yaml").read_text())
    config.update(audio_root=str(out.resolve()), global_cmvn={"stats_npz_path": str((out / "gcmvn.npz").resolve())})
    (out / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    caplog.clear()
    assert run(corpus, out, "--cmvn", "global") == 0
    assert not [r for r in caplog.records if "config.yaml: replacing" in r.getMessage()]
    assert yaml.safe_load((out / "config.yaml").read_text())["global_cmvn"] == {"stats_npz_path": "gcmvn.npz"}


def test_global_cmvn_without_training_subsets_is_refused(tmp_path, caplog):
    corpus, out = write_fixture(tmp_path), tmp_path / "data"
    assert prepare_librispeech.main(["--librispeech-root", str(corpus), "--out", str(out), "--subsets",
                                     "test-fixture", "--vocab-size", "24", "--jobs", "1", "--cmvn", "global"]) == 1
    errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert len(errors) == 1 and errors[0].startswith("--cmvn global computes its statistics on the training subsets")
    assert "test-fixture" in errors[0] and not (out / "fbank80").exists()  # refused before any feature


def test_switching_cmvn_on_a_prepared_directory_is_refused(tmp_path, caplog):
    corpus, out = write_fixture(tmp_path), tmp_path / "data"
    config = out / "config.yaml"
    assert run(corpus, out) == 0
    before = config.read_bytes()
    caplog.clear()
    assert run(corpus, out, "--cmvn", "global") == 1
    errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert len(errors) == 1 and str(config) in errors[0], errors
    assert "--cmvn global" in errors[0] and "uses utterance CMVN" in errors[0] and "--overwrite-cmvn" in errors[0]
    assert config.read_bytes() == before and not (out / "gcmvn.npz").exists()
    assert run(corpus, out, "--cmvn", "global", "--overwrite-cmvn") == 0
    assert yaml.safe_load(config.read_text())["feature_transforms"]["*"] == ["global_cmvn"]
    stats = out / "gcmvn.npz"
    written = (stats.read_bytes(), stats.stat().st_mtime_ns)
    assert run(corpus, out, "--cmvn", "global") == 0  # the same data again: the same statistics, left as they are
    assert (stats.read_bytes(), stats.stat().st_mtime_ns) == written
    caplog.clear()
    assert run(corpus, out) == 1  # back to utterance CMVN
    errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert len(errors) == 1 and str(config) in errors[0] and "--cmvn utterance" in errors[0]
    assert "uses global CMVN" in errors[0] and stats.is_file()
    assert run(corpus, out, "--overwrite-cmvn") == 0
    assert yaml.safe_load(config.read_text())["feature_transforms"]["*"] == ["utterance_cmvn"]
    assert "global_cmvn" not in yaml.safe_load(config.read_text()) and not stats.exists()


def test_evaluation_subsets_are_added_to_a_prepared_directory(tmp_path, caplog):
    corpus, out = write_fixture(tmp_path), tmp_path / "data"

    def prepare(subsets: str, *extra: str) -> int:
        return prepare_librispeech.main(["--librispeech-root", str(corpus), "--out", str(out), "--subsets", subsets,
                                         "--vocab-size", "24", "--jobs", "1", *extra])

    assert prepare("test-fixture") == 1  # nothing prepared to add it to
    errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert len(errors) == 1 and "no prepared vocabulary to add them to" in errors[0], errors
    assert "'test-fixture'" in errors[0] and not (out / "test-fixture.tsv").exists()
    assert prepare("train-fixture", "--cmvn", "global") == 0
    kept = {path: path.read_bytes() for path in out.iterdir() if path.is_file()}
    caplog.clear()
    assert prepare("test-fixture") == 1  # the directory's CMVN is global
    assert any("--cmvn utterance" in r.getMessage() for r in caplog.records if r.levelname == "ERROR")
    assert prepare("test-fixture", "--cmvn", "global", "--vocab-size", "30") == 0
    assert {path: path.read_bytes() for path in kept} == kept  # vocabulary, config.yaml, gcmvn.npz as they were
    rows = read_manifest(out / "test-fixture.tsv")
    assert {row["id"] for row in rows} == {f"{chapter}-{n:04d}" for chapter, lines in
                                           TRANSCRIPTS["test-fixture"].items() for n, _ in enumerate(lines)}
    assert all((out / row["audio"]).is_file() for row in rows)


def copy_recordings(corpus: Path, source: str, target: str, count: int) -> list[str]:
    """Copy the first ``count`` recordings of subset ``source`` into a new subset ``target`` under their own ids
    (with their transcript lines): the same recordings in two subsets. Returns their ids."""
    ids = []
    for transcript in sorted((corpus / source).glob("*/*/*.trans.txt")):
        lines = transcript.read_text().splitlines(keepends=True)[:count - len(ids)]
        directory = corpus / target / transcript.parent.relative_to(corpus / source)
        directory.mkdir(parents=True)
        (directory / transcript.name).write_text("".join(lines))
        for line in lines:
            ids.append(line.split()[0])
            shutil.copy(transcript.parent / f"{ids[-1]}.flac", directory)
        if len(ids) == count:
            return ids
    raise AssertionError(f"{source} has fewer than {count} recordings")


def test_an_evaluation_subset_added_later_is_checked_against_the_training_ids(tmp_path, caplog):
    """``--subsets test-dup`` on a prepared directory, test-dup holding three training recordings under their own
    ids: refused as it is when prepared with the training subset, naming the subset, the ids and the manifest."""
    corpus, out = write_fixture(tmp_path), tmp_path / "data"
    duplicated = copy_recordings(corpus, "train-fixture", "test-dup", 3)
    assert run(corpus, out) == 0
    kept = {path: path.read_bytes() for path in out.iterdir() if path.is_file()}

    def prepare(*extra: str) -> tuple[int, list[str]]:
        caplog.clear()
        code = prepare_librispeech.main(["--librispeech-root", str(corpus), "--out", str(out), "--subsets",
                                         "test-dup", "--vocab-size", "24", "--jobs", "1", *extra])
        return code, [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]

    code, errors = prepare()
    assert code == 1 and not (out / "test-dup.tsv").exists()
    for utterance_id in duplicated:
        (problem,) = [e for e in errors if e.startswith(f"utterance id {utterance_id} of test-dup (")]
        assert f"is already in {out}/train-fixture.tsv (fbank80/train-fixture/{utterance_id}.npy)" in problem
        assert "training data in an evaluation set" in problem
    assert {path: path.read_bytes() for path in kept} == kept  # the training manifest, vocabulary, config as they were
    code, _ = prepare("--skip-bad")  # left out, and listed
    assert code == 0 and read_manifest(out / "test-dup.tsv") == []
    assert len((out / "test-dup.rejected.tsv").read_text().splitlines()) == 3
    # prepared together, the same subsets are refused as well
    caplog.clear()
    assert prepare_librispeech.main(["--librispeech-root", str(corpus), "--out", str(tmp_path / "together"),
                                     "--subsets", "train-fixture,test-dup", "--vocab-size", "24", "--jobs", "1"]) == 1
    assert sum("training data in an evaluation set" in r.getMessage() for r in caplog.records) == 6


def test_preparing_the_same_subsets_again_is_no_conflict_with_their_manifests(tmp_path, caplog):
    """The manifests already there of the subsets prepared again, and a ``--combine-train`` manifest holding them,
    name the same features: no id conflict."""
    corpus, out = write_fixture(tmp_path), tmp_path / "data"
    assert run(corpus, out, "--combine-train", "train-all") == 0
    assert run(corpus, out) == 0
    assert prepare_librispeech.main(["--librispeech-root", str(corpus), "--out", str(out), "--subsets",
                                     "test-fixture", "--vocab-size", "24", "--jobs", "1"]) == 0
    assert not [r for r in caplog.records if r.levelname == "ERROR"]


@pytest.mark.parametrize("arguments, message", [
    (["--vocab-size", "2"], "--vocab-size 2: SentencePiece needs at least 5 units"),
    (["--subsets", "train-x,test-x,train-x"], "--subsets names train-x more than once"),
    (["--subsets", "train-x,test-x", "--train-subsets", "train-x,train-x"],
     "--train-subsets names train-x more than once"),
])
def test_settings_sentencepiece_cannot_take_or_a_subset_named_twice_are_usage_errors(tmp_path, capsys, arguments,
                                                                                   message):
    """Refused before any audio is read (no such corpus here), not as a SentencePiece traceback or a subset
    featurised twice."""
    with pytest.raises(SystemExit) as exit_status:
        prepare_librispeech.main(["--librispeech-root", str(tmp_path / "none"), "--out", str(tmp_path / "out"),
                                  *arguments])
    assert exit_status.value.code == 2 and message in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
