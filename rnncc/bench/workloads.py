"""What each system runs: a ``Case`` (a cell at sizes and a dtype) and the ``Workload`` that
times it: the raw cell, ``rnncc.RNN`` with its input projection (the fair comparison with
``torch.nn.LSTM``, whose time includes its own), or ``torch.nn.LSTM``/``GRU`` for a cell whose
IR is that of ``examples/lstm.rnn`` or ``examples/gru.rnn``. Inputs are random, never zeros."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rnncc.errors import RnnccError

if TYPE_CHECKING:
    import torch

    from rnncc.ir.cell import Cell
    from rnncc.runtime.api import CompiledCell

#: Storage dtypes by their short names.
DTYPES = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}
#: Cells with a cuDNN counterpart, by the example file whose IR they must equal.
BASELINES = {"lstm": "LSTM", "gru": "GRU"}
EXAMPLES_DIR = Path(__file__).resolve().parents[2] / "examples"
_L2_FALLBACK = 50 * 2**20  # an H100's L2, for devices that do not report theirs


@dataclass(frozen=True)
class Case:
    """What one measurement runs: a cell at sizes and a storage dtype (a key of DTYPES)."""

    cell: str
    B: int
    T: int
    NH: int
    D: int
    dtype: str

    @property
    def hidden(self) -> int:
        return self.NH * self.D

    def label(self) -> str:
        return f"{self.cell} B={self.B} T={self.T} {self.NH}×{self.D} {self.dtype}"


@dataclass
class Workload:
    """A system ready to run: ``make_inputs(seed)`` draws one input set (a tuple whose
    tensors require grad), ``forward(inputs)`` returns the tensor whose sum is the loss."""

    forward: Callable[[tuple[Any, ...]], torch.Tensor]
    make_inputs: Callable[[int], tuple[Any, ...]]
    set_bytes: int
    parameters: Sequence[torch.Tensor] = ()
    note: str = ""


def _dtype(name: str) -> torch.dtype:
    import torch

    if name not in DTYPES:
        raise RnnccError(f"unknown dtype {name!r}; expected one of {', '.join(DTYPES)}")
    return getattr(torch, DTYPES[name])  # type: ignore[no-any-return]


def _randn(shape: Sequence[int], dtype: str, device: Any, g: Any, scale: float = 1.0) -> Any:
    import torch

    t = torch.randn(tuple(shape), generator=g, device=device, dtype=_dtype(dtype))
    return t.mul_(scale).requires_grad_()


def _bytes(shapes: Sequence[Sequence[int] | None], dtype: str) -> int:
    itemsize = 4 if dtype == "fp32" else 2
    return sum(math.prod(s) * itemsize for s in shapes if s is not None)


def cell_workload(cell: CompiledCell, case: Case, backend: str, device: Any) -> Workload:
    """The raw cell on ``backend``: random ``Wx``, ``R`` (scaled by 1/√D), ``b``; the
    declared initial states and params."""
    import torch

    s = cell.shapes(case.B, case.T, case.NH, case.D)

    def make(seed: int) -> tuple[Any, ...]:
        g = torch.Generator(device=device).manual_seed(seed)
        return (
            _randn(s["Wx"], case.dtype, device, g),  # type: ignore[arg-type]
            None if s["R"] is None else _randn(s["R"], case.dtype, device, g, case.D**-0.5),
            None if s["b"] is None else _randn(s["b"], case.dtype, device, g, 0.1),
        )

    def forward(x: tuple[Any, ...]) -> torch.Tensor:
        Wx, R, b = x
        return cell(Wx, R, b, backend=backend)[0]

    return Workload(forward, make, _bytes([s["Wx"], s["R"], s["b"]], case.dtype))


def module_workload(cell: CompiledCell, case: Case, backend: str, device: Any) -> Workload:
    """``rnncc.RNN`` with its input projection (input size = hidden) on ``backend``."""
    import torch

    from rnncc.runtime.module import RNN

    layer = RNN(
        cell,
        case.hidden,
        case.hidden,
        num_heads=case.NH,
        backend=backend,
        device=device,
        dtype=_dtype(case.dtype),
    )
    shape = (case.B, case.T, case.hidden)

    def make(seed: int) -> tuple[Any, ...]:
        return (
            _randn(shape, case.dtype, device, torch.Generator(device=device).manual_seed(seed)),
        )

    return Workload(
        lambda x: layer(x[0])[0], make, _bytes([shape], case.dtype), list(layer.parameters())
    )


def cudnn_workload(baseline: str, case: Case, device: Any) -> Workload:
    """``torch.nn.LSTM``/``GRU`` of hidden ``case.hidden`` (input size = hidden, batch_first);
    training mode only when gradients are on, so ``fw`` runs cuDNN's inference forward."""
    import torch

    cls = getattr(torch.nn, BASELINES[baseline])
    layer = cls(case.hidden, case.hidden, batch_first=True, device=device, dtype=_dtype(case.dtype))
    shape = (case.B, case.T, case.hidden)

    def make(seed: int) -> tuple[Any, ...]:
        return (
            _randn(shape, case.dtype, device, torch.Generator(device=device).manual_seed(seed)),
        )

    def forward(x: tuple[Any, ...]) -> torch.Tensor:
        layer.train(torch.is_grad_enabled())
        return layer(x[0])[0]  # type: ignore[no-any-return]

    return Workload(
        forward,
        make,
        _bytes([shape], case.dtype),
        list(layer.parameters()),
        f"torch.nn.{BASELINES[baseline]} (cuDNN {torch.backends.cudnn.version()})",
    )


def detect_baseline(ir: Cell, examples: Path = EXAMPLES_DIR) -> str | None:
    """``"lstm"`` or ``"gru"`` when ``ir`` equals that example's IR up to the cell's name,
    else None (also when the examples are not there, as in an installed wheel)."""
    from rnncc.runtime.api import load

    for name in BASELINES:
        path = examples / f"{name}.rnn"
        if path.is_file() and dataclasses.replace(ir, name=name) == load(path).ir:
            return name
    return None


def l2_bytes(device: Any) -> int:
    import torch

    if not str(device).startswith("cuda"):
        return _L2_FALLBACK
    props = torch.cuda.get_device_properties(device)
    return int(getattr(props, "L2_cache_size", 0) or _L2_FALLBACK)
