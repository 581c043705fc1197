"""Stage dumps: with ``RNNCC_DUMP_DIR`` set, every compiler stage's output is written there.

Input: a stage name, the cell's name and the stage's text. Output: the file
``$RNNCC_DUMP_DIR/<cell>.<stage>`` (e.g. ``lstm.ast.txt``, ``lstm.ir.rnn``,
``lstm.backward.rnn``, ``lstm_stepwise.cu``), written atomically; nothing when the variable
is unset. Like Triton's dumps: for reading what the compiler did, not for loading back.
"""

from __future__ import annotations

import os

from rnncc.config import get_config


def dump(cell: str, stage: str, text: str) -> None:
    """Write one stage's output when dumping is on; see the module docstring."""
    directory = get_config().dump_dir
    if directory is None:
        return
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{cell}.{stage}"
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)
