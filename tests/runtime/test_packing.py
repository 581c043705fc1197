"""The packed output's gather: its gradient a copy into zeros (distinct rows), equal to
``index_select``'s, to the second order."""

from __future__ import annotations

import torch
from torch.nn.utils.rnn import pack_padded_sequence

from rnncc.runtime.packing import packed_like, packed_rows


def test_the_packed_output_s_gradient_is_index_select_s_to_the_second_order() -> None:
    B, T, F = 3, 4, 2
    like = pack_padded_sequence(torch.zeros(B, T, F), [2, 4, 1], True, enforce_sorted=False)
    index, _, T_packed = packed_rows(like)
    out = torch.randn(B, T, F, dtype=torch.float64, requires_grad=True)

    def gather(o: torch.Tensor) -> torch.Tensor:
        return packed_like(o, index, T_packed, like).data

    flat = out.detach().reshape(-1, F)
    assert torch.equal(gather(out), flat.index_select(0, index))
    assert torch.autograd.gradcheck(gather, (out,))
    assert torch.autograd.gradgradcheck(gather, (out,))
    g = torch.randn(len(index), F, dtype=torch.float64)
    (mine,) = torch.autograd.grad(gather(out), out, g)
    (theirs,) = torch.autograd.grad(out.reshape(-1, F).index_select(0, index), out, g)
    assert torch.equal(mine, theirs)
    assert torch.equal(
        mine.reshape(-1, F)[~torch.isin(torch.arange(B * T), index)],
        torch.zeros(B * T - len(index), F, dtype=torch.float64),
    )
