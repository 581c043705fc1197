"""The weights of one (layer, direction) of ``rnncc.RNN``: ``CellWeights``, initialised like
``nn.LSTM``'s, with R's mask once pruned, and the masked R a decoding step reads."""

from __future__ import annotations

import math
import weakref
from collections.abc import Callable
from typing import Any, TypedDict, overload

import torch
from torch import nn

from rnncc.runtime.api import CompiledCell, _may_keep
from rnncc.runtime.sparsity import masked, validate_mask

_Ref = weakref.ref[torch.Tensor]
_Kept = tuple[_Ref, _Ref, tuple[Any, ...], torch.Tensor]


class _Factory(TypedDict):
    """``device=`` and ``dtype=`` of the tensor factories, as given to ``RNN``."""

    device: torch.device | str | None
    dtype: torch.dtype | None


class _MaskedR:
    """``R * mask`` in a decoding step's dtype, kept while R and the mask are the same tensors
    at the same addresses with the same version counters (an optimizer's step or a
    ``masked_fill_`` moves them; a write through ``.data`` does not, as autograd does not see
    it either), for one CUDA stream (a copy another stream may still be writing is not read).
    Not kept while a CUDA graph captures (the graph then runs the product itself, on the R it
    reads at replay). Pickled and copied empty: it is made again on first use."""

    __slots__ = ("_kept",)

    def __init__(self) -> None:
        # R and the mask (weakly: a mask that set_mask_ replaced is freed), the key, R * mask
        self._kept: _Kept | None = None

    def __reduce__(self) -> tuple[Any, ...]:
        return (_MaskedR, ())

    def clear(self) -> None:
        self._kept = None

    def __call__(self, R: torch.Tensor, mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        on_cuda = R.is_cuda
        if not _may_keep(on_cuda) or R.is_inference() or mask.is_inference():
            return _cast(masked(R, mask), dtype)  # (inference tensors have no version counter)
        stream = torch.cuda.current_stream(R.device).stream_id if on_cuda else None
        key = (R._version, mask._version, R.data_ptr(), mask.data_ptr(), dtype, stream)
        kept = self._kept
        if kept is not None and kept[0]() is R and kept[1]() is mask and kept[2] == key:
            return kept[3]
        # Made outside inference mode and autograd (in that order: leaving inference mode
        # enables gradients), a constant that any later step may read.
        with torch.inference_mode(False), torch.no_grad():
            made = _cast(masked(R, mask), dtype)
        self._kept = (weakref.ref(R), weakref.ref(mask), key, made)
        return made


class CellWeights(nn.Module):
    """The weights of one (layer, direction), initialised like ``nn.LSTM``'s (uniform in
    ±1/√hidden_size; params at their declared values):

    - ``input_proj``: ``Linear(input_size, Gx · hidden_size)``, gate-major (``[Gx, NH, D]``);
      absent when the cell has no ``W x`` term;
    - ``R``: ``[Gr, NH, D, D]`` (out × in per head), absent without ``R h``;
    - ``b``: ``[Gb, NH, D]``, absent without ``b`` terms or with ``bias=False`` (then zeros);
    - ``params``: ``[P, NH, D]``, absent when the cell declares none;
    - ``R_mask``: a bool buffer of R's shape (True: kept) once pruned, else None; R is zero
      where it is False.
    """

    def __init__(
        self,
        cell: CompiledCell,
        input_size: int,
        hidden_size: int,
        num_heads: int,
        bias: bool,
        kw: _Factory,
    ):
        super().__init__()
        NH, D = num_heads, hidden_size // num_heads
        gx, gr, gb = len(cell.gx_names), len(cell.gr_names), len(cell.gb_names)
        self.hidden_size = hidden_size
        self.param_inits = tuple(p.init for p in cell.ir.params)
        self.input_proj = nn.Linear(input_size, gx * hidden_size, bias=bias, **kw) if gx else None
        self.R = nn.Parameter(torch.empty(gr, NH, D, D, **kw)) if gr else None
        self.b = nn.Parameter(torch.empty(gb, NH, D, **kw)) if gb and bias else None
        if gb and not bias:
            self.register_buffer("_zero_b", torch.zeros(gb, NH, D, **kw), persistent=False)
        P = len(self.param_inits)
        self.params = nn.Parameter(torch.empty(P, NH, D, **kw)) if P else None
        self.R_mask: torch.Tensor | None
        self.register_buffer("R_mask", None)  # persistent: in state_dict once set
        self._masked_R = _MaskedR()  # R as decoding steps run it, where there is a mask
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
                init = torch.tensor(self.param_inits, dtype=self.params.dtype)
                self.params.copy_(init.view(-1, 1, 1).expand_as(self.params))
        self._zero_dropped()

    def set_mask_(self, mask: torch.Tensor) -> None:
        """Keep ``mask`` (checked against R; a contiguous copy) as ``R_mask`` and zero R where
        it drops entries."""
        mask = validate_mask(mask, self.R)
        self.R_mask = mask.clone(memory_format=torch.contiguous_format)
        self._zero_dropped()

    def masked_R(self) -> torch.Tensor | None:
        """R as the cell calls run it: ``R * R_mask`` where there is a mask."""
        R, mask = self._parameters.get("R"), self._buffers.get("R_mask")
        return R if R is None or mask is None else masked(R, mask)

    def decoding(self, dtype: torch.dtype) -> tuple[torch.Tensor | None, ...]:
        """``tensors()`` as the decoding kernel takes them, in ``dtype``: R masked where there
        is a mask (the kernel takes none), that product kept while R and the mask are
        unchanged, so that a step does not make it again."""
        W, Wb, R, b, params = self.tensors()
        mask = self._buffers.get("R_mask")
        R = _cast(R, dtype) if R is None or mask is None else self._masked_R(R, mask, dtype)
        return _cast(W, dtype), _cast(Wb, dtype), R, _cast(b, dtype), _cast(params, dtype)

    def _apply(self, fn: Callable[..., Any], recurse: bool = True) -> CellWeights:
        self._masked_R.clear()  # a product of the tensors before the move or conversion
        moved: CellWeights = super()._apply(fn, recurse)
        return moved

    def _zero_dropped(self) -> None:
        # R's zeros at dropped entries are what optimizers keep (zero value, zero gradient)
        if self.R is not None and self.R_mask is not None:
            with torch.no_grad():
                self.R.masked_fill_(~self.R_mask, 0)

    def _load_from_state_dict(
        self,
        state_dict: dict[str, Any],
        prefix: str,
        local_metadata: dict[str, Any],
        strict: bool,
        *args: Any,
    ) -> None:
        # A pruned checkpoint loads into a dense CellWeights too: the mask's buffer is made
        # for it. A pruned CellWeights requires the key (strict), as any buffer.
        if self.R is not None and self.R_mask is None and prefix + "R_mask" in state_dict:
            self.R_mask = torch.ones_like(self.R, dtype=torch.bool)
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, *args)
        self._zero_dropped()

    def bias(self) -> torch.Tensor | None:
        """``b`` as the cell takes it: the zeros of ``bias=False`` where the cell has b terms."""
        return self.b if self.b is not None else getattr(self, "_zero_b", None)

    def tensors(self) -> tuple[torch.Tensor | None, ...]:
        """``(W, W's bias, R, b, params)`` as the cell takes them (None where absent), read
        from the module's dicts: a decoding step asks for them every call."""
        proj = self._modules.get("input_proj")
        W = Wb = None
        if proj is not None:
            W, Wb = proj._parameters.get("weight"), proj._parameters.get("bias")
        params = self._parameters
        b: torch.Tensor | None = params.get("b")
        if b is None:
            b = self._buffers.get("_zero_b")
        return W, Wb, params.get("R"), b, params.get("params")


@overload
def _cast(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor: ...
@overload
def _cast(t: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor | None: ...
def _cast(t: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor | None:
    return t if t is None or t.dtype == dtype else t.to(dtype)
