"""Replace an output file only once its new content is complete, so that a failure leaves the old file as it was.

    with replacing(out / "train.txt") as temporary:
        temporary.write_text(text)          # or open(temporary, "w"), torch.save(obj, temporary), ...

The new content is written to a temporary file in the same directory (same file system) and moved over the output
with ``os.replace``, which is atomic on POSIX: readers see the old file or the new one, never a half-written or
emptied one. If the ``with`` body raises, the temporary file is removed and the output is untouched. Plain Python
only.
"""
from __future__ import annotations

import contextlib
import os
import secrets
from pathlib import Path
from typing import Iterator


def temporary_sibling(path: Path) -> Path:
    """A fresh hidden name beside ``path`` that keeps its extension (``out/.train.1a2b3c4d.tmp.txt``), so writers
    that choose a format by extension (``matplotlib``'s ``savefig``) still do."""
    return path.with_name(f".{path.stem}.{os.getpid()}-{secrets.token_hex(4)}.tmp{path.suffix}")


@contextlib.contextmanager
def replacing(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path beside ``path`` for the caller to write; on a normal exit move it over ``path``
    (``os.replace``), on an exception remove it and re-raise, leaving ``path`` as it was.

    The caller creates the temporary file (``open``, ``torch.save``, ...), so it gets the usual permissions.
    """
    path = Path(path)
    temporary = temporary_sibling(path)
    try:
        yield temporary
        os.replace(temporary, path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
