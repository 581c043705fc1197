"""The problems of the plan table (tests/golden/plans-h100.txt): what is planned on CPU and,
on a GPU, checked against what runs.

LSTM, GRU and sLSTM over the head shapes, storage dtypes and batches the fused variants'
boundaries fall between; every other example at a multi-head and a single-head shape.
"""

from __future__ import annotations

from collections.abc import Iterator
from itertools import product
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"

#: Cells planned over the whole matrix.
MAIN_CELLS = ("lstm", "gru", "slstm")
#: (NH, D): small heads (block tier), a wide single head (grid tier) and the sizes past it.
SHAPES = ((1, 64), (12, 64), (2, 384), (1, 768), (1, 1024), (1, 2048))
DTYPES = ("bf16", "fp32")
BATCHES = (4, 16, 64)
#: The other examples: one multi-head and one single-head shape, at B = 16.
OTHER_SHAPES = ((12, 64), (1, 768))
OTHER_BATCH = 16


def plan_rows() -> Iterator[tuple[Path, int, int, str, int]]:
    """(cell file, NH, D, dtype, B) of every row of the plan table, in the table's order."""
    for name in MAIN_CELLS:
        for (nh, d), dtype, b in product(SHAPES, DTYPES, BATCHES):
            yield EXAMPLES / f"{name}.rnn", nh, d, dtype, b
    for path in sorted(EXAMPLES.glob("*.rnn")):
        if path.stem in MAIN_CELLS:
            continue
        for (nh, d), dtype, b in product(OTHER_SHAPES, DTYPES, (OTHER_BATCH,)):
            yield path, nh, d, dtype, b
