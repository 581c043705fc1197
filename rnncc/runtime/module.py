"""``rnncc.RNN``: a compiled cell as an ``nn.Module`` with its own weights.

Input: a ``CompiledCell`` (or a path to a ``.rnn`` file), sizes. Parameters, initialised
like ``torch.nn.LSTM`` (uniform in ±1/√hidden_size; params at their declared values):

- ``input_proj``: ``Linear(input_size, Gx · hidden_size)``, gate-major (``[Gx, NH, D]``);
  absent when the cell has no ``W x`` term;
- ``R``: ``[Gr, NH, D, D]`` (out × in per head), absent without ``R h``;
- ``b``: ``[Gb, NH, D]``, absent without ``b`` terms or with ``bias=False`` (then zeros);
- ``params``: ``[P, NH, D]``, absent when the cell declares none.

``forward(x, states=None)`` takes ``x`` ``[B, T, input_size]`` (``[T, B, input_size]`` with
``batch_first=False``) and optional ``states`` ``[S, B, hidden_size]``, and returns
``(outputs, last)``: ``outputs`` ``[B, T, O · hidden_size]`` (the output states concatenated
along the last axis, in the cell's ``output`` order; time-major with ``batch_first=False``)
and ``last`` ``[S, B, hidden_size]``, every state after the last step.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TypedDict

import torch
from torch import nn

from rnncc.runtime.api import CompiledCell, load


class _Factory(TypedDict):
    """``device=`` and ``dtype=`` of the tensor factories, as given to ``RNN``."""

    device: torch.device | str | None
    dtype: torch.dtype | None


class RNN(nn.Module):
    """A layer running a compiled cell over a sequence; see the module docstring."""

    def __init__(
        self,
        cell: CompiledCell | str | Path,
        input_size: int,
        hidden_size: int,
        num_heads: int = 1,
        bias: bool = True,
        batch_first: bool = True,
        backend: str = "auto",
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ):
        super().__init__()
        if not isinstance(cell, CompiledCell):
            cell = load(cell)
        if hidden_size % num_heads:
            raise ValueError(f"hidden_size={hidden_size} is not divisible by num_heads={num_heads}")
        self.cell = cell
        self.input_size = input_size
        self.hidden_size = hidden_size
        self.num_heads = num_heads
        self.head_dim = hidden_size // num_heads
        self.batch_first = batch_first
        self.backend = backend
        kw: _Factory = {"device": device, "dtype": dtype}
        NH, D = num_heads, self.head_dim
        gx, gr, gb = len(cell.gx_names), len(cell.gr_names), len(cell.gb_names)
        self.input_proj = nn.Linear(input_size, gx * hidden_size, bias=bias, **kw) if gx else None
        self.R = nn.Parameter(torch.empty(gr, NH, D, D, **kw)) if gr else None
        self.b = nn.Parameter(torch.empty(gb, NH, D, **kw)) if gb and bias else None
        if gb and not bias:
            self.register_buffer("_zero_b", torch.zeros(gb, NH, D, **kw), persistent=False)
        self.params = (
            nn.Parameter(torch.empty(len(cell.param_names), NH, D, **kw))
            if cell.param_names
            else None
        )
        self.reset_parameters()

    def reset_parameters(self) -> None:
        k = 1.0 / math.sqrt(self.hidden_size)
        with torch.no_grad():
            if self.input_proj is not None:
                for p in self.input_proj.parameters():
                    p.uniform_(-k, k)
            for w in (self.R, self.b):
                if w is not None:
                    w.uniform_(-k, k)
            if self.params is not None:
                init = torch.tensor([p.init for p in self.cell.ir.params], dtype=self.params.dtype)
                self.params.copy_(init.view(-1, 1, 1).expand_as(self.params))

    @property
    def output_size(self) -> int:
        return len(self.cell.outputs) * self.hidden_size

    def forward(
        self, x: torch.Tensor, states: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if x.dim() != 3 or x.shape[-1] != self.input_size:
            order = "[B, T, input_size]" if self.batch_first else "[T, B, input_size]"
            raise ValueError(
                f"x has shape {list(x.shape)}, expected {order} with input_size={self.input_size}"
            )
        if not self.batch_first:
            x = x.transpose(0, 1)
        B, T, _ = x.shape
        NH, D = self.num_heads, self.head_dim
        if self.input_proj is not None:
            Wx = self.input_proj(x).view(B, T, len(self.cell.gx_names), NH, D)
        else:
            Wx = x.new_empty(B, T, 0, NH, D)
        S = len(self.cell.state_names)
        if states is not None:
            if tuple(states.shape) != (S, B, self.hidden_size):
                raise ValueError(
                    f"states has shape {list(states.shape)}, expected "
                    f"[S={S}, B={B}, hidden_size={self.hidden_size}]"
                )
            states = states.reshape(S, B, NH, D)
        b = self.b if self.b is not None else getattr(self, "_zero_b", None)
        y, last = self.cell(Wx, self.R, b, states, self.params, backend=self.backend)
        O = y.shape[0]
        out = y.permute(1, 2, 0, 3, 4).reshape(B, T, O * self.hidden_size)
        if not self.batch_first:
            out = out.transpose(0, 1)
        return out, last.reshape(S, B, self.hidden_size)

    def extra_repr(self) -> str:
        return (
            f"cell={self.cell.name}, input_size={self.input_size}, hidden_size={self.hidden_size}, "
            f"num_heads={self.num_heads}, batch_first={self.batch_first}, backend={self.backend!r}"
        )
