"""A model and a task of different families stop with one line naming both (a checkpoint or --arch mix-up)."""
from __future__ import annotations

import subprocess

import pytest
from fairseq import options
from fairseq.data import Dictionary
from fairseq.tasks.language_modeling import LanguageModelingConfig, LanguageModelingTask
from omegaconf import OmegaConf

import spade_cases
import transducer_cases
from cli import BIN, REPO
from ssm_fairseq.text.mssm_roberta import MaskedSSMLanguageModel
from ssm_fairseq.text.spade_lm import SpadeLanguageModel
from ssm_fairseq.asr.transducer.model import TransducerModel
from ssm_fairseq.asr.transducer.task import SpeechTransducerTask
from test_mssm_roberta import TINY, build as build_masked_lm


def speech_task() -> SpeechTransducerTask:
    return SpeechTransducerTask.__new__(SpeechTransducerTask)  # no data needed: the check comes first


def test_a_transducer_refuses_a_text_task():
    _, _, cfg, _ = transducer_cases.build("mssm_transducer", *transducer_cases.SMALL)
    task = LanguageModelingTask(LanguageModelingConfig(), Dictionary())
    with pytest.raises(ValueError, match="'transducer' is a speech transducer and needs --task speech_transducer; "
                                         "got --task language_modeling"):
        TransducerModel.build_model(cfg.model, task)


def test_language_models_refuse_the_speech_task():
    _, cfg, _ = spade_cases.build("spade_lm")
    with pytest.raises(ValueError, match="'spade_lm' needs --task language_modeling; got --task speech_transducer"):
        SpadeLanguageModel.build_model(cfg.model, speech_task())
    masked_cfg = build_masked_lm("mssm_roberta_base", **TINY).args
    with pytest.raises(ValueError, match="'mssm_roberta' needs --task masked_lm or sentence_prediction; "
                                         "got --task speech_transducer"):
        MaskedSSMLanguageModel.build_model(masked_cfg, speech_task())


def test_the_speech_task_refuses_another_model_family():
    cfg = OmegaConf.create({"_name": "spade_lm_wiki103"})
    with pytest.raises(ValueError, match="got --arch spade_lm_wiki103 .model spade_lm."):
        speech_task().build_model(cfg)


@pytest.mark.parametrize("arch, found", [
    ("transformer_lm", "got --arch transformer_lm (model transformer_lm)"),  # fairseq's config conversion failed
    ("transformer", "got an --arch that defines --max-source-positions, an option of the task (a model of another "
                    "family?)"),  # argparse failed on the clash
])
def test_fairseq_train_refuses_another_family_s_arch_in_one_line(tmp_path, arch, found):
    """Before any data is read: the model's config or options clash with the speech task's inside fairseq."""
    result = subprocess.run([str(BIN / "fairseq-train"), str(tmp_path), "--user-dir", "ssm_fairseq", "--task",
                             "speech_transducer", "--arch", arch, "--criterion", "transducer"],
                            capture_output=True, text=True, cwd=REPO)
    assert result.returncode == 2
    assert result.stderr.splitlines()[-1] == (
        "fairseq-train: error: --task speech_transducer trains and decodes transducer models (--arch "
        f"mssm_transducer, stateformer_transducer, ...); {found}")
    assert "Traceback" not in result.stderr and "usage:" not in result.stderr


def test_the_speech_task_parses_a_transducer_arch_and_leaves_unknown_names_to_argparse(capsys):
    def parse(arch: str):
        return options.parse_args_and_arch(options.get_training_parser(), [
            "data", "--task", "speech_transducer", "--arch", arch, "--criterion", "transducer"])

    assert parse("stateformer_transducer").arch == "stateformer_transducer"
    with pytest.raises(SystemExit):
        parse("no_such_arch")
    assert "argument --arch/-a: invalid choice: 'no_such_arch'" in capsys.readouterr().err


@pytest.mark.parametrize("task, arch, expected", [
    ("language_modeling", "mssm_transducer", "--arch mssm_transducer (model transducer) trains with --task "
                                             "speech_transducer; got --task language_modeling"),
    ("masked_lm", "spade_lm", "--arch spade_lm (model spade_lm) trains with --task language_modeling; got --task "
                              "masked_lm"),
    ("translation", "mssm_roberta_base", "--arch mssm_roberta_base (model mssm_roberta) trains with --task masked_lm "
                                         "or sentence_prediction; got --task translation"),
])
def test_fairseq_s_text_tasks_refuse_another_family_s_arch_in_one_line(tmp_path, task, arch, expected):
    """Before any data is read (fairseq's config conversion failed with a hydra traceback naming neither)."""
    result = subprocess.run([str(BIN / "fairseq-train"), str(tmp_path), "--user-dir", "ssm_fairseq", "--task", task,
                             "--arch", arch], capture_output=True, text=True, cwd=REPO)
    assert result.returncode == 2
    assert result.stderr.splitlines()[-1] == f"fairseq-train: error: {expected}"
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize("task, arch", [
    ("language_modeling", "spade_lm"), ("language_modeling", "transformer_lm"), ("masked_lm", "mssm_roberta_base"),
    ("sentence_prediction", "mssm_roberta_base"), ("translation", "spade_t5_small"), ("denoising", "spade_t5_small"),
])
def test_text_tasks_parse_their_own_models(task, arch):
    args = options.parse_args_and_arch(options.get_training_parser(), ["data", "--task", task, "--arch", arch])
    assert args.arch == arch
