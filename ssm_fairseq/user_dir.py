"""The directory to give fairseq's ``--user-dir``: that of the ``ssm_fairseq`` package Python imports.

    fairseq-train DATA --user-dir "$(python -m ssm_fairseq.user_dir)" --task speech_transducer ...

prints it (for an installed package, ``.../site-packages/ssm_fairseq``; for an editable install, the clone's). fairseq
imports a user directory under its last path component, so the path is that of the package as imported, symbolic
links not resolved: its last component is always ``ssm_fairseq``, and the plugin is never imported twice under two
names.
"""
from __future__ import annotations

import os


def user_dir() -> str:
    """The absolute path of the ``ssm_fairseq`` package directory."""
    return os.path.dirname(os.path.abspath(__file__))


if __name__ == "__main__":
    print(user_dir())
