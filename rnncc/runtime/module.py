"""``rnncc.RNN``: a compiled cell as a drop-in for ``torch.nn.LSTM``/``GRU``/``RNN``.

A stack of ``num_layers`` layers, each running the cell in one or two directions, with what
``nn.LSTM`` takes: padded batches (with ``lengths=``) or a ``PackedSequence``
(``rnncc/runtime/packing.py``), one sequence, initial states as one tensor or as ``nn.LSTM``'s
``(h0, c0)``, dropout between layers, autocast. The weights of each (layer, direction) sit in
one ``CellWeights`` module (``rnncc/runtime/weights.py``), in ``nn.LSTM``'s ``h_n`` order; a
layer's directions run in one cell call, as the two halves of its heads (the reverse
direction's reversed: ``reverse=[False] * NH + [True] * NH``). A pruned ``CellWeights``
holds a bool buffer ``R_mask`` beside ``R``, and R is zero wherever it drops an entry; the cell
call gets the masks (``mask=``), so R's gradient is zero there too and training keeps the
zeros. docs/api.md states the API; ``rnncc/runtime/torch_compat.py`` converts from and to the
torch modules.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, cast

import torch
from torch import nn
from torch.nn.utils.rnn import PackedSequence

from rnncc.runtime.api import (
    CompiledCell,
    check_backend,
    check_out,
    decodes,
    load_for_layer,
    no_out,
    refuse_torch_func,
    runs_kernels,
)
from rnncc.runtime.overlap import (
    beside,
    defer_r_gradient,
    join_after,
    project_beside,
    recurrent_beside,
)
from rnncc.runtime.packing import packed_like, packed_rows, padded, zero_past
from rnncc.runtime.sparsity import is_density, magnitude_mask, validate_mask
from rnncc.runtime.validate import (
    CheckedLengths,
    Sizes,
    _shape,
    autocast_off,
    autocast_on,
    validate_lengths,
)
from rnncc.runtime.weights import CellWeights, _cast, _Factory

# Pickles made before weights.py name the masked R's class here.
from rnncc.runtime.weights import _MaskedR as _MaskedR

#: What ``states=`` takes: ``[S, L·dirs, B, H]``, a tuple of ``S`` tensors ``[L·dirs, B, H]``
#: (``nn.LSTM``'s ``(h0, c0)``), or ``[L·dirs, B, H]`` for a cell of one state (``h0``).
States = torch.Tensor | Sequence[torch.Tensor]


#: A layer's cell-call mask as ``RNN._mask`` keeps it: its sources, their (version, storage), the mask.
_LayerMask = tuple[tuple[torch.Tensor | None, ...], tuple[tuple[int, int], ...], torch.Tensor]


class RNN(nn.Module):
    """A stack of layers running a compiled cell; see the module docstring and docs/api.md."""

    def __init__(
        self,
        cell: CompiledCell | str | Path,
        input_size: int,
        hidden_size: int,
        num_layers: int = 1,
        num_heads: int = 1,
        bias: bool = True,
        batch_first: bool = True,
        dropout: float = 0.0,
        bidirectional: bool = False,
        backend: str = "auto",
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
        sparsity: float | None = None,
    ):
        super().__init__()
        if not isinstance(cell, CompiledCell):
            cell = load_for_layer(cell)
        for name, size, least in (
            ("input_size", input_size, 0),
            ("hidden_size", hidden_size, 1),
            ("num_heads", num_heads, 1),
            ("num_layers", num_layers, 1),
        ):
            if isinstance(size, bool) or not isinstance(size, int) or size < least:
                what = "a positive" if least else "a non-negative"
                raise ValueError(f"{name} must be {what} int, got {size!r}")
        if hidden_size % num_heads:
            raise ValueError(f"hidden_size={hidden_size} is not divisible by num_heads={num_heads}")
        if isinstance(dropout, bool) or not isinstance(dropout, int | float):
            raise ValueError(f"dropout must be a number in [0, 1], got {dropout!r}")
        if not 0 <= dropout <= 1:
            raise ValueError(f"dropout must be in [0, 1], got {dropout}")
        if sparsity is not None and not is_density(sparsity):
            raise ValueError(
                f"sparsity must be None (dense) or a density in (0, 1], got {sparsity!r}"
            )
        if dropout > 0 and num_layers == 1:
            warnings.warn(
                f"dropout={dropout} acts between layers, and num_layers=1 has none",
                UserWarning,
                stacklevel=2,
            )
        self.cell = cell
        self.input_size = input_size
        self.hidden_size = hidden_size
        self.num_layers = num_layers
        self.num_heads = num_heads
        self.head_dim = hidden_size // num_heads
        self.bias = bias
        self.batch_first = batch_first
        self.dropout = float(dropout)
        self.bidirectional = bidirectional
        self.backend = backend
        self.sparsity = None if sparsity is None else float(sparsity)
        kw: _Factory = {"device": device, "dtype": dtype}
        dirs = self.num_directions
        #: One per (layer, direction) in ``nn.LSTM``'s ``h_n`` order: ``weights[l * dirs + d]``.
        #: Layer ``l + 1`` takes all of layer ``l``'s output (``output_size`` features).
        self.weights = nn.ModuleList(
            CellWeights(
                cell, input_size if k < dirs else self.output_size, hidden_size, num_heads, bias, kw
            )
            for k in range(num_layers * dirs)
        )
        # per layer: the masks of its directions (sources, their versions) and their concat
        self._layer_masks: dict[int, _LayerMask] = {}
        if self.sparsity is not None:
            self.prune_(self.sparsity)

    @property
    def num_directions(self) -> int:
        return 2 if self.bidirectional else 1

    @property
    def output_size(self) -> int:
        """Features of ``out``: ``num_directions · O · hidden_size``."""
        return self.num_directions * len(self.cell.outputs) * self.hidden_size

    def reset_parameters(self) -> None:
        """Draw every weight again; a pruned R keeps its mask (zero where it drops)."""
        for w in self.weights:
            assert isinstance(w, CellWeights)
            w.reset_parameters()

    # ---- sparse R ------------------------------------------------------------------------
    def prune_(self, density: float) -> RNN:
        """Prune every R by magnitude: each ``CellWeights``' ``R_mask`` keeps the
        ``ceil(density · D · D)`` largest ``|R|`` of each (gate, head) among the entries it
        already keeps, and R is zeroed elsewhere. Again on a pruned layer it selects among the
        kept entries, so a density above the current one changes nothing. Returns ``self``."""
        if not is_density(density):
            raise ValueError(f"density must be a number in (0, 1], got {density!r}")
        for w in self._with_R("prune_"):
            assert w.R is not None
            w.set_mask_(magnitude_mask(w.R, float(density), among=w.R_mask))
        return self

    def set_masks_(self, masks: Sequence[torch.Tensor]) -> RNN:
        """Set each ``CellWeights``' ``R_mask`` to a copy of ``masks[k]`` (bool, R's shape and
        device; True: kept), in ``weights`` order, and zero R where it drops. All are checked
        before any is set. Returns ``self``."""
        ws = self._with_R("set_masks_")
        if not isinstance(masks, Sequence) or len(masks) != len(ws):
            kind = type(masks).__name__
            article = "an" if kind[0].lower() in "aeiou" else "a"
            got = f"{len(masks)}" if isinstance(masks, Sequence) else f"{article} {kind}"
            raise ValueError(
                f"set_masks_ takes a list of {len(ws)} masks, one per (layer, direction) in "
                f"layer.weights order; got {got}"
            )
        for k, (w, mask) in enumerate(zip(ws, masks, strict=True)):
            try:
                validate_mask(mask, w.R)
            except ValueError as err:
                raise ValueError(f"masks[{k}]: {err}") from None
        for w, mask in zip(ws, masks, strict=True):
            w.set_mask_(mask)
        return self

    def _with_R(self, what: str) -> list[CellWeights]:
        ws = [self._weights(k) for k in range(len(self.weights))]
        if not ws or ws[0].R is None:
            raise ValueError(
                f"{what}: cell '{self.cell.name}' has no R (no 'R h' term) to make sparse"
            )
        return ws

    def _mask(self, layer: int, ws: list[CellWeights]) -> torch.Tensor | None:
        """The ``mask=`` of a layer's cell call: its directions' ``R_mask`` side by side on the
        heads axis (all True for a direction without one); None for a dense layer. On a GPU the
        concatenation is kept while its sources are unchanged (the same tensors, storage and
        version counters), so that the planner measures a bidirectional layer's mask once, as
        a unidirectional one's; elsewhere (nothing plans there) and while torch.compile traces
        (a version counter is no value it can guard on), it is made each call, so that it
        follows every write to the masks."""
        masks = tuple(w._buffers.get("R_mask") for w in ws)
        if all(m is None for m in masks):
            return None
        if len(masks) == 1:
            return masks[0]

        def joined() -> torch.Tensor:
            parts = [
                m if m is not None else torch.ones_like(w.R, dtype=torch.bool)  # type: ignore[arg-type]
                for w, m in zip(ws, masks, strict=True)
            ]
            return torch.cat(parts, dim=1)

        on_gpu = next(m for m in masks if m is not None).is_cuda
        if not on_gpu or torch.compiler.is_compiling():
            return joined()
        versions = tuple((-1, 0) if m is None else (m._version, m.data_ptr()) for m in masks)
        kept = self._layer_masks.get(layer)
        if (
            kept is not None
            and kept[1] == versions
            and all(a is b for a, b in zip(kept[0], masks, strict=True))
        ):
            return kept[2]
        mask = joined()
        self._layer_masks[layer] = (masks, versions, mask)
        return mask

    @classmethod
    def from_torch(cls, module: nn.Module, *, backend: str = "auto") -> RNN:
        """The layer equal to ``module`` (an ``nn.LSTM``, ``nn.GRU`` or ``nn.RNN``): its built-in
        cell, sizes, options and a copy of its weights, on its device and dtype."""
        from rnncc.runtime.torch_compat import from_torch

        return from_torch(module, backend=backend)

    def to_torch(self) -> nn.RNNBase:
        """The ``nn.LSTM``/``GRU``/``RNN`` equal to this layer, with a copy of its weights; the
        cell must be a built-in one (``rnncc.load_builtin``) and ``num_heads`` 1."""
        from rnncc.runtime.torch_compat import to_torch

        return to_torch(self)

    def flatten_parameters(self) -> None:
        """Nothing to do, and kept so that code written for ``nn.LSTM`` runs: cuDNN needs a
        module's weights in one buffer, rnncc's kernels take each layer's as they are."""

    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)
        except AttributeError:
            # nn.LSTM's weight names (weight_ih_l0, ...): views of the layer's own weights
            from rnncc.runtime.torch_compat import torch_weight

            found = torch_weight(self, name)
            if found is None:
                raise
            return found

    def __setattr__(self, name: str, value: Any) -> None:
        # weight_hh_l0 and its kin are views: an attribute of that name would shadow the view
        # and leave the weights the layer runs as they were (torch would replace them)
        if name.startswith(("weight_", "bias_")):
            from rnncc.runtime.torch_compat import refuse_torch_weight_assignment

            refuse_torch_weight_assignment(self, name)
        elif name == "backend":  # the constructor's and later ones
            check_backend(value)
        super().__setattr__(name, value)

    def _load_from_state_dict(
        self,
        state_dict: dict[str, Any],
        prefix: str,
        local_metadata: dict[str, Any],
        strict: bool,
        missing_keys: list[str],
        unexpected_keys: list[str],
        error_msgs: list[str],
    ) -> None:
        # A torch module's checkpoint: its keys renamed before the weights' modules load
        # (load_state_dict hands them this dict after this call).
        from rnncc.runtime.torch_compat import rename_torch_keys

        rename_torch_keys(self, state_dict, prefix, error_msgs)
        super()._load_from_state_dict(
            state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs
        )

    # ---- calling -------------------------------------------------------------------------
    def forward(
        self,
        x: torch.Tensor | PackedSequence,
        states: States | None = None,
        lengths: torch.Tensor | Sequence[int] | None = None,
        *,
        hx: States | None = None,
    ) -> tuple[torch.Tensor | PackedSequence, torch.Tensor]:
        """``(out, last)``; docs/api.md gives the shapes. ``hx``: ``states`` by
        ``nn.LSTM``'s keyword."""
        refuse_torch_func("an RNN call")
        if hx is not None:
            if states is not None:
                raise TypeError("RNN.forward: pass the initial states as states or as hx, not both")
            states = hx
        if isinstance(x, torch.Tensor) and x.dim() == 2:  # one sequence, as nn.LSTM takes it
            return self._one_sequence(x, states, lengths)
        packed = x if isinstance(x, PackedSequence) else None
        if packed is not None:
            if lengths is not None:
                raise ValueError(
                    "lengths= is for padded tensors; a PackedSequence carries its own lengths"
                )
            if packed.data.dim() != 2 or packed.data.shape[1] != self.input_size:
                raise ValueError(
                    f"x is a PackedSequence of data shape {_shape(packed.data)}, expected "
                    f"[N, input_size={self.input_size}]"
                )
            index, checked, T_packed = packed_rows(packed)  # once: the way in and out
            x = padded(packed, index, len(checked.tensor), T_packed)
        else:
            if not isinstance(x, torch.Tensor) or x.dim() != 3 or x.shape[-1] != self.input_size:
                order = "[B, T, input_size]" if self.batch_first else "[T, B, input_size]"
                got = f"shape {_shape(x)}" if isinstance(x, torch.Tensor) else type(x).__name__
                raise ValueError(
                    f"x has {got}, expected {order} with input_size={self.input_size}, "
                    "[T, input_size] (one sequence) or a PackedSequence"
                )
            if not self.batch_first:
                x = x.transpose(0, 1)
        B, T, _ = x.shape
        ctype = self._compute_dtype(x)
        rows: torch.Tensor | CheckedLengths | None = None
        if packed is not None:
            rows = checked
        elif lengths is not None:
            if not isinstance(lengths, torch.Tensor):
                try:
                    lengths = torch.as_tensor(lengths)
                except (TypeError, ValueError, RuntimeError) as err:
                    raise ValueError(
                        f"lengths must be [B={B}] integers in 1..T={T}, got {lengths!r}"
                    ) from err
                if not lengths.numel():  # `[]` for an empty batch: as_tensor makes it float
                    lengths = lengths.long()
            # Kept on the CPU: each direction's cell call checks them there and copies them
            # to the GPU without a synchronisation.
            checked_rows = validate_lengths(lengths, B, T, torch.device("cpu"))
            x = zero_past(x, checked_rows)
            rows = checked_rows
        init = self._initial_states(states, x, ctype)
        dirs = self.num_directions
        lasts: list[torch.Tensor] = []
        # Under autocast the casts are _run's own (to ctype), not autocast's per op.
        with autocast_off(x.device.type):
            h = x
            below: torch.Tensor | None = None  # the lower layer's cell call's output
            for layer in range(self.num_layers):
                if layer and self.dropout:
                    h = nn.functional.dropout(h, self.dropout, self.training)
                ks = list(range(layer * dirs, (layer + 1) * dirs))
                start = None if init is None else init[:, ks[0] : ks[-1] + 1]  # a view
                h, last, below = self._layer(ks, h, start, rows, ctype, below)
                lasts.append(last)
            last = torch.cat(lasts, dim=1)
            if packed is not None:
                return packed_like(h, index, T_packed, packed), last
        # time-major as nn.LSTM's: contiguous (callers merge T and B with view)
        return (h if self.batch_first else h.transpose(0, 1).contiguous()), last

    def _one_sequence(
        self,
        x: torch.Tensor,
        states: States | None,
        lengths: torch.Tensor | Sequence[int] | None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``forward`` of one sequence (``nn.LSTM``'s unbatched input): ``x`` ``[T, input_size]``
        and ``states`` without their batch axis (``_batched_states``) → ``out``
        ``[T, dirs·O·H]``, ``last`` ``[S, L·dirs, H]``; a batch of one underneath, whatever
        ``batch_first`` says."""
        if x.shape[1] != self.input_size:
            raise ValueError(
                f"x has shape {_shape(x)}, expected [T, input_size={self.input_size}] for one "
                "sequence (or a batch, or a PackedSequence)"
            )
        if lengths is not None:
            raise ValueError("lengths= is for a batch; x [T, input_size] is one sequence")
        axis = 0 if self.batch_first else 1
        out, last = self.forward(x.unsqueeze(axis), self._batched_states(states))
        assert isinstance(out, torch.Tensor)
        return out.squeeze(axis), last.squeeze(2)

    def _batched_states(self, states: States | None) -> States | None:
        """One sequence's ``states`` (``[S, K, H]``, a tuple of ``S`` tensors ``[K, H]``, or
        ``h0`` ``[K, H]`` for a cell of one state; ``K`` layers × directions) as a batch of
        one's, checked."""
        names = self.cell.state_names
        S, K, H = len(names), self.num_layers * self.num_directions, self.hidden_size
        if isinstance(states, tuple | list):
            if len(states) != S or not all(
                isinstance(s, torch.Tensor) and tuple(s.shape) == (K, H) for s in states
            ):
                got = ", ".join(
                    _shape(s) if isinstance(s, torch.Tensor) else type(s).__name__ for s in states
                )
                raise ValueError(
                    f"states for one sequence as a tuple hold one tensor [num_layers*"
                    f"num_directions={K}, hidden_size={H}] per state ({', '.join(names)}); "
                    f"got {got}"
                )
            return [s.unsqueeze(1) for s in states]
        if isinstance(states, torch.Tensor):
            if tuple(states.shape) == (S, K, H):
                return states.unsqueeze(2)
            if S == 1 and tuple(states.shape) == (K, H):  # h0 of nn.GRU and nn.RNN
                return states.view(1, K, 1, H)
            raise ValueError(
                f"states has shape {_shape(states)}, expected [S={S} ({', '.join(names)}), "
                f"num_layers*num_directions={K}, hidden_size={H}] for one sequence"
            )
        return states

    def step(
        self,
        x_t: torch.Tensor,
        states: States | None = None,
        *,
        out: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One time step of a unidirectional stack: ``x_t`` ``[B, input_size]`` and ``states``
        as ``forward`` takes them → ``(out_t, new_states)``, ``out_t`` ``[B, O · hidden_size]``
        and ``new_states`` ``[S, num_layers, B, hidden_size]`` (one sequence: no batch axis
        anywhere, as in ``forward``). ``T`` steps equal ``forward`` over ``T`` steps (dropout
        aside), gradients included. On CUDA, where no gradient is
        recorded (``torch.no_grad()``, or nothing requires grad), each layer is one launch of
        the decoding kernel, its input projection included, written into ``out=(out_t,
        new_states)`` where given (no allocation; ``new_states`` must not be ``states``)."""
        refuse_torch_func("RNN.step")
        if self.bidirectional:
            raise ValueError("step runs unidirectional layers; this layer is bidirectional")
        if isinstance(x_t, torch.Tensor) and x_t.shape == (self.input_size,):  # one sequence
            batched = None if out is None else (out[0].unsqueeze(0), out[1].unsqueeze(2))
            out_t, new = self.step(x_t[None], self._batched_states(states), out=batched)
            return out if out is not None else (out_t[0], new[:, :, 0])
        if not isinstance(x_t, torch.Tensor) or x_t.dim() != 2 or x_t.shape[1] != self.input_size:
            got = f"shape {_shape(x_t)}" if isinstance(x_t, torch.Tensor) else type(x_t).__name__
            raise ValueError(
                f"x_t has {got}, expected [B, input_size={self.input_size}] or "
                "[input_size] (one sequence)"
            )
        ctype = self._compute_dtype(x_t)
        if decodes(self.backend, x_t.device, ctype, lambda: self._inputs(x_t, states)):
            return self._decode(x_t, states, out, ctype)
        if out is not None:
            raise no_out(self.backend, x_t.device, ctype)
        x = x_t.unsqueeze(1 if self.batch_first else 0)
        y, last = self.forward(x, states)
        assert isinstance(y, torch.Tensor)
        return (y[:, 0] if self.batch_first else y[0]), last

    def _inputs(self, x_t: torch.Tensor, states: States | None) -> Iterator[torch.Tensor | None]:
        """What a step's gradient would flow to: the input, the states, the weights."""
        yield x_t
        yield from states if isinstance(states, tuple | list) else (states,)
        for w in self._cell_weights():
            yield from w.tensors()

    def _decode(
        self,
        x_t: torch.Tensor,
        states: States | None,
        out: tuple[torch.Tensor, torch.Tensor] | None,
        ctype: torch.dtype,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``step`` on the decoding kernel: one launch per layer, all from one call into the
        host library (``KernelOps.decode_stack``), each layer reading its slice of the stack's
        states and writing its slice of the new ones. Every Python operation here costs each
        decoding step (a few microseconds are a third of a step): the sizes are worked out
        once, and states and ``out`` that are already what the kernels take are checked in
        one comparison each."""
        cell = self.cell
        S, O, L, NH, D, H, first = self._decode_sizes()
        B, device = x_t.shape[0], x_t.device
        h = x_t if x_t.dtype == ctype else x_t.to(ctype)
        if (
            type(states) is torch.Tensor
            and states.shape == (S, L, B, H)
            and states.dtype == ctype
            and states.device == device
        ):
            init: torch.Tensor | None = states
        else:
            init = self._initial_states(states, x_t, ctype)
            if init is not None and init.dtype != ctype:
                init = init.to(ctype)
        if init is None:  # the declared values, kept by the cell (only read), for every layer
            declared = cell._declared(Sizes(B, 1, NH, D), h, states=True)
            init = declared.view(S, 1, B, H).expand(S, L, B, H)
        kw: _Factory = {"device": device, "dtype": ctype}
        if out is None:
            out_t, new = torch.empty(B, O * H, **kw), torch.empty(S, L, B, H, **kw)
        else:
            out_t, new = check_out(
                out, ((B, O * H), (S, L, B, H)), kw, "[B, O·hidden_size], [S, L, B, H]"
            )
        weights: list[torch.Tensor] = []  # the present ones, layer by layer
        present = -1  # which of (W, Wb, R, b, params) a layer has: bit 0, 1, ...
        for w in self._cell_weights():
            has = 0
            for bit, t in enumerate(w.decoding(ctype)):
                if t is not None:
                    weights.append(t)
                    has |= 1 << bit
            if present not in (-1, has):
                raise RuntimeError("rnncc: the layers of a stack hold different weights")
            present = has
        cell._decoder(device).decode_stack(
            h,
            weights,
            present,
            init,
            NH,
            first,
            self.dropout if self.training else 0.0,
            out_t,
            new,
        )
        cell.last_backend, cell.last_plan = "decode", None
        return out_t, new

    def _decode_sizes(self) -> tuple[int, int, int, int, int, int, int]:
        """(S, O, num_layers, num_heads, head_dim, hidden_size, the output state's index) of a
        decoding step, worked out on the first."""
        found: tuple[int, int, int, int, int, int, int] | None = self.__dict__.get("_sizes")
        if found is None:
            cell = self.cell
            names = cell.state_names
            found = self.__dict__["_sizes"] = (
                len(names),
                len(cell.outputs),
                self.num_layers,
                self.num_heads,
                self.head_dim,
                self.hidden_size,
                names.index(cell.outputs[0]),
            )
        return found

    def _layer(
        self,
        ks: list[int],
        x: torch.Tensor,
        states: torch.Tensor | None,
        lengths: torch.Tensor | CheckedLengths | None,
        ctype: torch.dtype,
        below: torch.Tensor | None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """One layer, ``x`` ``[B, T, I]`` → ``out`` ``[B, T, dirs·O·H]``, ``last``
        ``[S, dirs, B, H]`` and its cell call's output ``y``; its (layer, direction)s ``ks``
        in one cell call: the directions' heads side by side (``dirs·NH`` heads, the reverse
        direction's last), so that both run in one launch; every tensor cast to ``ctype``
        (autocast's dtype, else the weights'). ``states``: ``[S, dirs, B, H]`` or None (the
        declared initial values); ``below``: the layer below's ``y`` (None for the first
        layer): above the first layer, the gradients of the projection's weights and of ``R``
        may be made on a second CUDA stream, beside the backward of the layer below
        (``rnncc/runtime/overlap.py``)."""
        ws = [self._weights(k) for k in ks]
        B, T, _ = x.shape
        dirs, NH, D, S = len(ks), self.num_heads, self.head_dim, len(self.cell.state_names)
        H = self.hidden_size

        def heads(ts: list[torch.Tensor | None], axis: int) -> torch.Tensor | None:
            # the directions' weights side by side on their heads axis
            given = [_cast(t, ctype) for t in ts if t is not None]
            if not given:
                return None
            return given[0] if dirs == 1 else torch.cat(given, dim=axis)

        if states is not None:  # [S, dirs, B, H] → [S, B, dirs·NH, D]
            states = _cast(states.transpose(1, 2).reshape(S, B, dirs * NH, D), ctype)
        # Beside the lower layer's backward: where the cell op runs CUDA kernels (first order,
        # as the side stream's Functions are; the reference backend's is differentiable
        # again) and has an input projection, whose backward R's gradient follows.
        side = (
            below is not None
            and ws[0].input_proj is not None
            and runs_kernels(self.backend, x.device, ctype)
            and beside(x)
        )
        node = below.grad_fn if below is not None and side else None
        if node is not None:
            join_after(node, x.device)
        mask = self._mask(ks[0] // dirs, ws)
        later, r_token = None, None
        if node is not None and mask is None:  # (a mask is applied to R on this stream)
            R, r_token, later = recurrent_beside(x.device, lambda: heads([w.R for w in ws], 1))
        else:
            R = heads([w.R for w in ws], 1)
        y, last = self.cell._call(
            self._project(ws, x, ctype, node, r_token),
            R,
            heads([w.bias() for w in ws], 1),
            states,
            heads([w.params for w in ws], 1),
            backend=self.backend,
            lengths=lengths,
            reverse=[False] * NH + [True] * NH if dirs == 2 else False,
            mask=mask,
        )
        if later is not None and y.grad_fn is not None:
            # the kernel op's backward leaves R's gradient in later and returns None for R
            defer_r_gradient(y.grad_fn, later)
        O = y.shape[0]
        # y [O, B, T, dirs·NH, D] → [B, T, dirs, O, H]; last [S, B, dirs·NH, D] → [S, dirs, B, H]
        out = y.view(O, B, T, dirs, H).permute(1, 2, 3, 0, 4).reshape(B, T, dirs * O * H)
        return out, last.view(S, B, dirs, H).transpose(1, 2), y

    def _weights(self, k: int) -> CellWeights:
        w = self.weights[k]
        assert isinstance(w, CellWeights)
        return w

    def _cell_weights(self) -> Iterable[CellWeights]:
        """``weights`` in order, read from the module's dicts: ``self.weights`` costs a
        decoding step a microsecond each time."""
        weights = cast(nn.ModuleList, self._modules["weights"])
        return cast(Iterable[CellWeights], weights._modules.values())

    def _project(
        self,
        ws: list[CellWeights],
        x: torch.Tensor,
        ctype: torch.dtype,
        below: torch.autograd.graph.Node | None,
        r_token: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """W x of the directions ``ws`` from ``x`` ``[B, T, I]``: ``[B, T, Gx, dirs·NH, D]``
        (contiguous) in ``ctype``, in one GEMM: the directions' weight rows interleaved so that
        the product comes out with their heads side by side. ``below``: the autograd node of
        the layer below's cell call, whose backward the weights' gradients then run beside,
        on a second CUDA stream (``rnncc/runtime/overlap.py``; ``r_token``: R's gradient's
        there, after this projection's backward); None: on this stream."""
        B, T, I = x.shape
        NH, D, G, H = self.num_heads, self.head_dim, len(self.cell.gx_names), self.hidden_size
        dirs = len(ws)
        linears = [w.input_proj for w in ws if w.input_proj is not None]
        if not linears:  # a cell without W x
            return x.new_empty(B, T, 0, dirs * NH, D, dtype=ctype)

        def interleaved(ts: Sequence[torch.Tensor], rows: tuple[int, ...]) -> torch.Tensor:
            # gate-major rows of every direction, gate by gate (one direction: as it is)
            cast = [_cast(t, ctype) for t in ts]
            if len(cast) == 1:
                return cast[0]
            return torch.stack([t.view(rows) for t in cast], dim=1).flatten(0, 2)

        def weights() -> tuple[torch.Tensor, torch.Tensor | None]:
            weight = interleaved([p.weight for p in linears], (G, H, I))
            biases = [p.bias for p in linears if p.bias is not None]
            return weight, interleaved(biases, (G, H, 1)).view(-1) if biases else None

        x = _cast(x, ctype)
        if below is not None:  # W's and b's gradients beside the lower layer's backward
            out = project_beside(x.reshape(B * T, I), weights, r_token)
        else:
            out = nn.functional.linear(x, *weights())
        return out.view(B, T, G, dirs * NH, D)

    def _first_weight(self) -> torch.Tensor | None:
        # The first layer's first weight (every layer holds the same dtype, on one device);
        # not self.parameters(), whose walk over the modules costs a step microseconds.
        first = next(iter(self._cell_weights()), None)
        p = None if first is None else next(iter(first._parameters.values()), None)
        return next(self.parameters(), None) if p is None else p

    def _weights_dtype(self, x: torch.Tensor) -> torch.dtype:
        p = self._first_weight()
        return x.dtype if p is None else p.dtype

    def _compute_dtype(self, x: torch.Tensor) -> torch.dtype:
        """The dtype the cell runs in: autocast's for float32 weights where autocast is on for
        ``x``'s device (fp32 master weights, as ``nn.LSTM``), else the weights' own. Checks
        that ``x`` is on the weights' device."""
        p = self._first_weight()
        if p is not None and p.device != x.device:
            raise ValueError(f"x is on {x.device}, expected {p.device} like the layer's weights")
        dtype = x.dtype if p is None else p.dtype
        if dtype == torch.float32 and autocast_on(device := x.device.type):
            ctype = torch.get_autocast_dtype(device)
            if x.dtype not in (dtype, ctype):
                raise ValueError(
                    f"x has dtype {x.dtype}, expected {dtype} like the layer's weights or "
                    f"{ctype} (autocast's)"
                )
            return ctype
        if x.dtype != dtype:
            raise ValueError(f"x has dtype {x.dtype}, expected {dtype} like the layer's weights")
        return dtype

    def _initial_states(
        self, states: States | None, x: torch.Tensor, ctype: torch.dtype
    ) -> torch.Tensor | None:
        """``states`` as ``[S, L·dirs, B, H]``, checked against ``x``; None for the declared
        initial values."""
        if states is None:
            return None
        names = self.cell.state_names
        S, K, B, H = len(names), self.num_layers * self.num_directions, x.shape[0], self.hidden_size

        # the expected shapes, spelled only to raise: a decoding step checks its states each call
        def legend() -> str:
            return f"[S={S} ({', '.join(names)}), {one()[1:]}"

        def one() -> str:
            return f"[num_layers*num_directions={K}, B={B}, hidden_size={H}]"

        if isinstance(states, tuple | list):
            if len(states) != S or not all(isinstance(s, torch.Tensor) for s in states):
                raise ValueError(
                    f"states as a tuple holds one tensor {one()} per state of cell "
                    f"'{self.cell.name}' ({', '.join(names)}); got "
                    + (
                        f"{len(states)} items"
                        if len(states) != S
                        else ", ".join(type(s).__name__ for s in states)
                    )
                )
            for i, (name, s) in enumerate(zip(names, states, strict=True)):
                if tuple(s.shape) != (K, B, H):
                    raise ValueError(
                        f"states[{i}] ({name}) has shape {_shape(s)}, expected {one()}"
                    )
                # each checked, as stacking would promote a dtype or raise without the name
                if s.device != x.device:
                    raise ValueError(
                        f"states[{i}] ({name}) is on {s.device}, expected {x.device} like x"
                    )
                if s.dtype != states[0].dtype:
                    raise ValueError(
                        f"states[{i}] ({name}) has dtype {s.dtype}, expected {states[0].dtype} "
                        f"like states[0] ({names[0]})"
                    )
            with autocast_off(x.device.type):  # autocast's stack fails on some 16-bit dtypes
                states = torch.stack(list(states))
        elif not isinstance(states, torch.Tensor):
            raise ValueError(
                f"states must be a tensor {legend()} or a tuple, got {type(states).__name__}"
            )
        elif S == 1 and states.dim() == 3:  # h0 of nn.GRU and nn.RNN
            if tuple(states.shape) != (K, B, H):
                raise ValueError(
                    f"states (h0) has shape {_shape(states)}, expected {one()} (or {legend()})"
                )
            states = states.unsqueeze(0)
        if tuple(states.shape) != (S, K, B, H):
            raise ValueError(f"states has shape {_shape(states)}, expected {legend()}")
        if states.device != x.device:
            raise ValueError(f"states is on {states.device}, expected {x.device} like x")
        if states.dtype != ctype and states.dtype != self._weights_dtype(x):
            raise ValueError(
                f"states has dtype {states.dtype}, expected {self._weights_dtype(x)} like the "
                "layer's weights"
            )
        return states

    def extra_repr(self) -> str:
        parts = [
            f"cell={self.cell.name}",
            f"input_size={self.input_size}",
            f"hidden_size={self.hidden_size}",
            f"num_layers={self.num_layers}",
            f"num_heads={self.num_heads}",
        ]
        if not self.bias:
            parts.append("bias=False")
        parts.append(f"batch_first={self.batch_first}")
        if self.dropout:
            parts.append(f"dropout={self.dropout}")
        if self.bidirectional:
            parts.append("bidirectional=True")
        parts.append(f"backend={self.backend!r}")
        if self.sparsity is not None:
            parts.append(f"sparsity={self.sparsity}")
        return ", ".join(parts)
