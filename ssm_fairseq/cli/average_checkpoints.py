"""Average the parameters of a model's last N epoch checkpoints (``checkpoint{EPOCH}.pt``) into one checkpoint.

The result keeps the configuration of the newest checkpoint, so ``fairseq-generate --path`` loads it like any
other. fairseq 0.12's own ``scripts/average_checkpoints.py`` is not part of its pip package, so this is ours.
Every checkpoint is checked as it is read (``ssm_fairseq.integrity.checkpoint_checks``: CRCs, finite weights);
checkpoints of
different model configurations (architecture fields, dictionary files: ``config_differences``) or parameter shapes
are refused naming both files. So is an ``--output`` that is one of the inputs or has a name that fairseq-train writes
or resumes from in its checkpoint directory (``checkpoint_last.pt``, ``checkpoint_best.pt``, ``checkpointN.pt``,
``checkpoint_N_M.pt``, ``checkpoint.best_*.pt``, each also with a suffix): written there, the average (without
optimizer state) would become the resume state of the next ``fairseq-train``, or be averaged again as an epoch.
The output is written to a temporary file beside it that replaces it once complete, so a failure leaves the old
file; a missing output directory is created.

    ssm-average-checkpoints --checkpoint-dir DIR --last 5 --output DIR/checkpoint_avg5.pt

(``python scripts/average_checkpoints.py`` in the repository runs the same ``main``.)
"""
from __future__ import annotations

import argparse
import logging
import re
import sys
from pathlib import Path

import torch
from fairseq import checkpoint_utils
from omegaconf import OmegaConf

import ssm_fairseq  # noqa: F401  (allow-lists what our tasks' checkpoints hold)
from ssm_fairseq.atomic_files import replacing
from ssm_fairseq.integrity.checkpoint_checks import config_differences

logger = logging.getLogger("average_checkpoints")
# the file names fairseq's checkpoint_utils writes or reads in --save-dir (any --checkpoint-suffix or shard suffix
# follows the part matched here): checkpoint_last, checkpoint_best, checkpoint{epoch}, checkpoint_{epoch}_{updates},
# checkpoint.best_{metric}_{value}
FAIRSEQ_CHECKPOINT_NAME = re.compile(r"checkpoint(_last|_best|\d|_\d+_\d|\.best_).*\.pt")


def last_epoch_checkpoints(directory: Path, count: int) -> list[Path]:
    """The ``count`` checkpoints of the highest epochs in ``directory``, oldest first."""
    by_epoch = {}
    for path in directory.glob("checkpoint*.pt"):
        match = re.fullmatch(r"checkpoint(\d+)\.pt", path.name)
        if match:
            by_epoch[int(match.group(1))] = path
    if len(by_epoch) < count:
        raise FileNotFoundError(f"{directory} has {len(by_epoch)} epoch checkpoints (checkpointN.pt); "
                                f"averaging needs {count}")
    return [by_epoch[epoch] for epoch in sorted(by_epoch)[-count:]]


def average(paths: list[Path]) -> dict:
    """The newest checkpoint with its ``model`` parameters replaced by the mean over ``paths``."""
    total: dict[str, torch.Tensor] = {}
    first = newest = None
    for path in paths:
        newest = checkpoint_utils.load_checkpoint_to_cpu(str(path))
        first = first or newest
        check_same_model(paths[0], first, path, newest)
        for name, value in newest["model"].items():
            total[name] = total.get(name, 0) + value.double()
    newest["model"] = {name: (value / len(paths)).to(newest["model"][name].dtype) for name, value in total.items()}
    newest["last_optimizer_state"] = None  # an average is for decoding, not for resuming training
    if OmegaConf.is_config(newest["cfg"]):  # the loader made it a DictConfig; store plain containers, as fairseq does
        newest["cfg"] = OmegaConf.to_container(newest["cfg"], resolve=True, enum_to_str=True)
    return newest


def check_same_model(first_path: Path, first: dict, path: Path, state: dict) -> None:
    """Raise ``ValueError`` naming both files unless checkpoint ``state`` (read from ``path``) holds the model of
    ``first`` (read from ``first_path``): the same configuration, parameter names and shapes."""
    differences = config_differences(first["cfg"]["model"], state["cfg"]["model"], str(first_path), str(path))
    if differences:
        raise ValueError(f"{path} holds another model than {first_path}: {'; '.join(differences)}")
    if state["model"].keys() != first["model"].keys():
        names = sorted(state["model"].keys() ^ first["model"].keys())
        raise ValueError(f"{path} has different parameters from {first_path} (e.g. {names[0]}): not the same "
                         f"architecture")
    for name, value in state["model"].items():
        if value.shape != first["model"][name].shape:
            raise ValueError(f"{path}: parameter {name} has shape {tuple(value.shape)}, "
                             f"{tuple(first['model'][name].shape)} in {first_path}: not the same architecture")


def check_output(output: Path, inputs: list[Path], last: int) -> None:
    """Raise ``ValueError`` naming ``output`` if it is a directory, one of the ``inputs``, or (as given or where
    a symbolic link leads) a checkpoint name that fairseq-train writes or resumes from."""
    suggestion = f"e.g. {output.with_name(f'checkpoint_avg{last}.pt')}"
    if output.is_dir():
        raise ValueError(f"--output {output} is a directory: give the file to write ({suggestion})")
    if output.resolve() in {path.resolve() for path in inputs}:
        raise ValueError(f"--output {output} is one of the checkpoints averaged: write the average to another file "
                         f"({suggestion})")
    for name in dict.fromkeys((output.name, output.resolve().name)):
        if FAIRSEQ_CHECKPOINT_NAME.fullmatch(name):
            raise ValueError(f"--output {output}: {name} is a name fairseq-train writes and resumes from in a "
                             f"checkpoint directory (checkpoint_last.pt, checkpoint_best.pt, checkpointN.pt, "
                             f"checkpoint_N_M.pt, checkpoint.best_*.pt); the average there would replace the resume "
                             f"state or be taken for an epoch's checkpoint: pick another name ({suggestion})")


def save(state: dict, output: Path) -> None:
    """Write checkpoint ``state`` to ``output`` through a temporary file beside it, creating a missing directory;
    an ``OSError`` names ``output`` and says that it was left as it was."""
    if not output.parent.is_dir():
        logger.info(f"creating {output.parent}")
        output.parent.mkdir(parents=True)
    try:
        with replacing(output) as temporary:
            torch.save(state, temporary)
    except (OSError, RuntimeError) as error:  # torch's zip writer raises RuntimeError on a failed write
        raise OSError(f"--output {output}: could not write the average ({error}); the file is as it was") from error


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--checkpoint-dir", type=Path, required=True)
    parser.add_argument("--last", type=int, default=5, help="how many of the last epoch checkpoints to average")
    parser.add_argument("--output", type=Path, required=True,
                        help="the file to write (not a name fairseq-train uses, e.g. checkpoint_avg5.pt)")
    args = parser.parse_args(argv)
    if args.last < 1:
        parser.error(f"--last must be at least 1, got {args.last}")
    logging.basicConfig(format="%(asctime)s | %(levelname)s | %(name)s | %(message)s", level=logging.INFO)
    try:
        paths = last_epoch_checkpoints(args.checkpoint_dir, args.last)
        check_output(args.output, paths, args.last)
        save(average(paths), args.output)
    except (OSError, ValueError) as error:
        logger.error(str(error))
        return 1
    logger.info(f"averaged {', '.join(p.name for p in paths)} -> {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
