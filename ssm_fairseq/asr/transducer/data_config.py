"""A speech data directory's ``config.yaml`` whose paths are read relative to the directory, so that it can move.

fairseq's ``S2TDataConfig`` hands ``audio_root`` and ``global_cmvn.stats_npz_path`` to the dataset and to
``GlobalCMVN`` as written: a relative path is opened from the working directory (fairseq's
``_auto_convert_to_abs_path`` tries the data directory for the tokenizers' files, not for these), and an absolute
one names wherever the directory was prepared. ``DataDirectoryConfig`` resolves both against the directory that
holds ``config.yaml`` (``resolve_in_data_directory``), as the ``speech_transducer`` task, transcription (through
the task) and the checkpoint checks read them:

* a relative path: under the data directory if it is there, else as written (from the working directory, as
  fairseq opens it); an empty ``audio_root`` (fairseq's setting for manifests of absolute paths) stays empty;
* an absolute path that exists: as written;
* an absolute path that no longer exists (a directory prepared with absolute paths, then moved): for
  ``audio_root`` the data directory itself (where ``ssm-prepare-librispeech`` puts the features), for a file the
  file of the same name beside ``config.yaml``, each with a warning (once per process).

Global CMVN statistics found nowhere raise ``FileNotFoundError`` naming ``config.yaml``, the path and what to do.

``ssm-prepare-librispeech`` writes ``audio_root: .`` and ``stats_npz_path: gcmvn.npz``.
"""
from __future__ import annotations

import functools
import logging
from pathlib import Path

from fairseq.data.audio.data_cfg import S2TDataConfig

from ..preparation.cmvn import GLOBAL_CMVN_STATS

logger = logging.getLogger(__name__)

GLOBAL_CMVN = "global_cmvn"  # fairseq's feature transform, and config.yaml's section holding its stats_npz_path


def resolve_in_data_directory(path: str, root: Path, is_directory: bool = False) -> Path:
    """``path`` as written in ``root/config.yaml``, resolved as the module doc says (the caller names a file that
    is still missing); ``is_directory``: ``audio_root``, which falls back to ``root`` itself."""
    written = Path(path)
    if not written.is_absolute():
        return root / written if (root / written).exists() else written
    beside = root if is_directory else root / written.name
    if written.exists() or not beside.exists():
        return written
    _warn_moved(root, path, "." if is_directory else written.name)
    return beside


@functools.cache  # once per path and process: the task reads the config once per split
def _warn_moved(root: Path, written: str, relative: str) -> None:
    logger.warning(f"{root / 'config.yaml'} names {written}, which does not exist (the data directory was prepared "
                   f"elsewhere and moved?): reading {root / relative} instead. Write it as {relative}, relative to "
                   f"the data directory, in config.yaml to silence this")


def find_global_cmvn_stats(written: str | None, root: Path) -> Path:
    """The global CMVN statistics file that ``root/config.yaml`` names as ``written``, resolved; one that cannot be
    found (or none named) raises ``FileNotFoundError`` naming ``config.yaml``, the path and what to do."""
    found = resolve_in_data_directory(written, root) if written else None
    if found is None or not found.is_file():
        raise FileNotFoundError(f"{root / 'config.yaml'} applies global_cmvn with the statistics "
                                f"{written or '(none: no global_cmvn.stats_npz_path)'}, which cannot be found (as "
                                f"written, nor in {root}): copy the {GLOBAL_CMVN_STATS} it was prepared with into "
                                f"{root}, or prepare it again (ssm-prepare-librispeech --cmvn global)")
    return found


class DataDirectoryConfig(S2TDataConfig):
    """fairseq's ``S2TDataConfig`` with ``audio_root`` and the global CMVN statistics resolved against the data
    directory (``resolve_in_data_directory``)."""

    @property
    def audio_root(self) -> str:
        """Where manifest paths are relative to: the resolved ``audio_root`` (empty: as fairseq, the manifest's
        paths stand alone)."""
        written = self.config.get("audio_root", "")
        return str(resolve_in_data_directory(written, Path(self.root), is_directory=True)) if written else ""

    def get_feature_transforms(self, split: str, is_train: bool) -> dict:
        """fairseq's transform config for ``split``; where it applies ``global_cmvn``, its ``stats_npz_path``
        resolved (``find_global_cmvn_stats``)."""
        config = super().get_feature_transforms(split, is_train)
        if GLOBAL_CMVN in (config.get("feature_transforms") or []):
            section = config.get(GLOBAL_CMVN) or {}
            stats = find_global_cmvn_stats(section.get("stats_npz_path"), Path(self.root))
            config[GLOBAL_CMVN] = {**section, "stats_npz_path": str(stats)}
        return config
