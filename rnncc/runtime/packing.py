"""``PackedSequence`` in and out of ``rnncc.RNN``: where each packed row sits in the padded
batch, found without waiting for the GPU, and one gather each way."""

from __future__ import annotations

import numpy as np
import torch
from torch.nn.utils.rnn import PackedSequence

from rnncc.runtime.validate import CheckedLengths, moved


def packed_rows(packed: PackedSequence) -> tuple[torch.Tensor, CheckedLengths, int]:
    """Where each row of ``packed.data`` sits in a padded ``[B, T]`` batch (caller's order),
    as flat indices ``b * T + t``, the rows' lengths (int64, the caller's order) and T, both
    tensors on the data's device: one gather converts either way, rather than PyTorch's pack
    and pad, whose backward copies once per time step. Nothing here waits for the GPU: the
    sort order lives there, so the indices and lengths are made there, from what the batch
    sizes (on the CPU) give, in numpy (a few µs where torch's CPU ops take tens each, and the
    host's time here is the GPU's wait at the start of every call)."""
    sizes = packed.batch_sizes.numpy()  # non-increasing, on the CPU
    T, B = len(sizes), int(sizes[0]) if len(sizes) else 0
    # time-major, as the packed data: step t holds sorted rows 0 .. sizes[t] - 1
    steps = np.repeat(np.arange(T), sizes)
    rows = np.arange(len(steps)) - np.repeat(np.cumsum(sizes) - sizes, sizes)
    lengths = np.searchsorted(-sizes, -np.arange(B))  # sorted row i's steps: sizes[t] > i
    device, order = packed.data.device, packed.sorted_indices
    if order is None:
        return _on(rows * T + steps, device), CheckedLengths(_on(lengths, device)), T
    host = _on(np.concatenate([steps, rows, lengths]), device)
    steps_d, rows_d, lengths_d = host.split([len(steps), len(steps), B])
    order = order.to(device, non_blocking=True)
    index = torch.add(steps_d, order.index_select(0, rows_d), alpha=T)
    unsorted = packed.unsorted_indices
    assert unsorted is not None  # PackedSequence sets both or neither
    lengths_d = lengths_d.index_select(0, unsorted.to(device, non_blocking=True))
    return index, CheckedLengths(lengths_d), T


def _on(a: np.ndarray, device: torch.device) -> torch.Tensor:
    """``a`` as an int64 tensor on ``device``, copied there without waiting for the GPU."""
    return moved(torch.from_numpy(np.ascontiguousarray(a, dtype=np.int64)), device)


def padded(packed: PackedSequence, index: torch.Tensor, B: int, T: int) -> torch.Tensor:
    """``pad_packed_sequence(packed, batch_first=True)``'s tensor as one differentiable
    scatter (``index``: ``packed_rows``')."""
    data = packed.data
    flat = data.new_zeros((B * T, data.shape[1])).index_copy(0, index, data)
    return flat.view(B, T, data.shape[1])


def packed_like(
    out: torch.Tensor, index: torch.Tensor, T: int, like: PackedSequence
) -> PackedSequence:
    """``out`` ``[B, T', F]`` (batch in the caller's order) packed in ``like``'s layout (its
    batch sizes and sort order; ``index``, ``T``: its ``packed_rows``), as ``nn.LSTM``
    returns a packed output; one gather."""
    data = _Rows.apply(out[:, :T].reshape(-1, out.shape[-1]), index)
    return PackedSequence(data, like.batch_sizes, like.sorted_indices, like.unsorted_indices)


class _Rows(torch.autograd.Function):
    """``flat.index_select(0, index)`` for distinct indices, whose gradient is a copy into
    zeros (``index_copy``) where ``index_select``'s adds with atomics (bf16 ones on CUDA: 0.14
    ms of a packed training step of two bidirectional 768-unit layers on an H200, which then
    took 0.07 ms less). The backward is made of differentiable ops: a second order goes
    through it."""

    @staticmethod
    def forward(
        ctx: torch.autograd.function.FunctionCtx, flat: torch.Tensor, index: torch.Tensor
    ) -> torch.Tensor:
        ctx.save_for_backward(index)
        ctx.rows = flat.shape[0]  # type: ignore[attr-defined]
        return flat.index_select(0, index)

    @staticmethod
    def backward(
        ctx: torch.autograd.function.FunctionCtx, g: torch.Tensor
    ) -> tuple[torch.Tensor, None]:
        (index,) = ctx.saved_tensors  # type: ignore[attr-defined]
        rows: int = ctx.rows  # type: ignore[attr-defined]
        return g.new_zeros((rows, g.shape[1])).index_copy(0, index, g), None


def zero_past(x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """Padded ``x`` ``[B, T, I]`` with 0 past each row's length (``lengths``: checked, on the
    CPU): the input projection runs over every position, and whatever the padding holds (a
    NaN, an inf) would reach the weights' gradient through the zero cotangent there. ``x``
    itself where every row is whole."""
    T = x.shape[1]
    if not len(lengths) or int(lengths.min()) == T:
        return x
    keep = torch.arange(T) < lengths[:, None]
    return torch.where(moved(keep, x.device)[..., None], x, 0)
