"""A stored feature file (``.npy``) checked from its header, without reading its data: what data preparation reuses
and what a manifest's rows are checked against."""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np


def npy_shape(path: Path) -> tuple[int, ...]:
    """The array shape in a ``.npy`` header, without reading the data.

    ``ValueError`` (or ``OSError``) if the file is not a ``.npy`` file or is shorter than its header says (a write
    cut short, a 0-byte file left by a crash).
    """
    with open(path, "rb") as f:
        try:
            major, _ = np.lib.format.read_magic(f)
            read_header = np.lib.format.read_array_header_1_0 if major == 1 else np.lib.format.read_array_header_2_0
            shape, _, dtype = read_header(f)
        except EOFError as error:
            raise ValueError(str(error)) from None
        expected = f.tell() + int(np.prod(shape)) * dtype.itemsize
        size = os.fstat(f.fileno()).st_size
    if size != expected:
        raise ValueError(f"{size} bytes where its header promises {expected}")
    return shape
