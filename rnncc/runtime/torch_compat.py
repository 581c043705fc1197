"""``rnncc.RNN`` from and to ``torch.nn.LSTM``, ``GRU`` and ``RNN`` (tanh, relu).

Each torch module has a built-in cell that computes exactly what it does (``rnncc/cells``):
its gates in torch's order (LSTM i, f, g, o; GRU r, z, n), ``weight_ih`` and ``bias_ih`` as
the input projection, ``weight_hh`` as ``R`` (one head) and ``bias_hh`` as ``b`` (for GRU the
``b_hn`` inside the reset product, as torch has it). So converting copies tensors and reshapes
them, nothing else (``to_torch`` copies a pruned R masked: its ``weight_hh`` is dense, with
zeros at the dropped entries). ``proj_size`` has no counterpart and is refused. A torch
module's ``state_dict`` loads into the equivalent layer (``rename_torch_keys``).
"""

from __future__ import annotations

import contextlib
import re
import warnings
import weakref
from collections.abc import Iterator
from functools import cache
from typing import Any, cast

import torch
from torch import nn

from rnncc.runtime.api import CompiledCell, load_builtin
from rnncc.runtime.module import RNN
from rnncc.runtime.weights import CellWeights

#: The built-in cell of each torch module, by (class, nonlinearity).
BUILTIN_OF: dict[tuple[type[nn.LSTM | nn.GRU | nn.RNN], str | None], str] = {
    (nn.LSTM, None): "lstm",
    (nn.GRU, None): "gru",
    (nn.RNN, "tanh"): "elman",
    (nn.RNN, "relu"): "elman_relu",
}


def _builtin_name(module: nn.Module) -> str:
    for (cls, nonlinearity), name in BUILTIN_OF.items():
        if type(module) is cls and getattr(module, "nonlinearity", None) == nonlinearity:
            return name
    base = next((cls for cls, _ in BUILTIN_OF if isinstance(module, cls)), None)
    builtin = (
        None if base is None else BUILTIN_OF.get((base, getattr(module, "nonlinearity", None)))
    )
    subclass = (
        f", a subclass of nn.{base.__name__} whose own code would not carry over: make an "
        f"rnncc.RNN of the built-in cell '{builtin}' with its sizes and load its state_dict"
        if base is not None and builtin is not None and type(module) is not base
        else ""
    )
    raise ValueError(
        f"RNN.from_torch takes torch.nn.LSTM, GRU or RNN (tanh or relu), got {type(module).__name__}"
        + (f" with nonlinearity={module.nonlinearity!r}" if type(module) is nn.RNN else "")
        + subclass
    )


@cache
def _builtin_source(name: str) -> str:
    return load_builtin(name).source()


def _suffixes(layer: RNN) -> list[str]:
    """torch's parameter suffix of each ``layer.weights[k]``: ``_l0``, ``_l0_reverse``, ..."""
    dirs = layer.num_directions
    return [f"_l{k // dirs}" + ("_reverse" if k % dirs else "") for k in range(len(layer.weights))]


@contextlib.contextmanager
def _dropout_warned() -> Iterator[None]:
    """Building the other side of a conversion: its warning that dropout needs more than one
    layer was given when the module being converted was made."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*dropout", category=UserWarning)
        yield


def from_torch(module: nn.Module, *, backend: str = "auto") -> RNN:
    """See ``RNN.from_torch``."""
    name = _builtin_name(module)
    assert isinstance(module, nn.RNNBase)
    if module.proj_size > 0:
        raise ValueError(
            f"{type(module).__name__} with proj_size={module.proj_size} has no rnncc counterpart "
            "(rnncc.RNN has no output projection)"
        )
    ref = next(module.parameters())
    with _dropout_warned():
        layer = RNN(
            load_builtin(name),
            module.input_size,
            module.hidden_size,
            num_layers=module.num_layers,
            bias=module.bias,
            batch_first=module.batch_first,
            dropout=module.dropout,
            bidirectional=module.bidirectional,
            backend=backend,
            device=ref.device,
            dtype=ref.dtype,
        )
    layer.train(module.training)
    _copy(layer, module, to_torch=False)
    return layer


#: Each cell's torch module (class, nonlinearity), or None: printing a cell to compare it
#: with the built-ins takes tens of µs, and ``layer.weight_hh_l0`` asks on every access.
_KIND_OF: weakref.WeakKeyDictionary[
    CompiledCell, tuple[type[nn.LSTM | nn.GRU | nn.RNN], str | None] | None
] = weakref.WeakKeyDictionary()


def _torch_kind(layer: RNN) -> tuple[type[nn.LSTM | nn.GRU | nn.RNN], str | None]:
    """The torch module (class, nonlinearity) equal to ``layer``; ValueError if there is none."""
    cell = layer.cell
    if cell not in _KIND_OF:
        source = cell.source()
        _KIND_OF[cell] = next(
            (key for key, name in BUILTIN_OF.items() if _builtin_source(name) == source), None
        )
    found = _KIND_OF[cell]
    if found is None:
        raise ValueError(
            f"cell '{layer.cell.name}' is not a built-in cell of torch's modules "
            f"({', '.join(BUILTIN_OF.values())}): it has no torch equivalent"
        )
    if layer.num_heads != 1:
        raise ValueError(
            f"num_heads={layer.num_heads}: torch's modules have one head (a dense R); "
            "only num_heads=1 converts"
        )
    return found


def to_torch(layer: RNN) -> nn.RNNBase:
    """See ``RNN.to_torch``."""
    cls, nonlinearity = _torch_kind(layer)
    p = next(layer.parameters())
    extra = {} if nonlinearity is None else {"nonlinearity": nonlinearity}
    with _dropout_warned():
        module = cls(
            layer.input_size,
            layer.hidden_size,
            num_layers=layer.num_layers,
            bias=layer.bias,
            batch_first=layer.batch_first,
            dropout=layer.dropout,
            bidirectional=layer.bidirectional,
            device=p.device,
            dtype=p.dtype,
            **extra,
        )
    module.train(layer.training)
    _copy(layer, module, to_torch=True)
    return module


#: A CellWeights' parameters and torch's names for them (before the ``_l0`` suffix).
_TORCH_NAMES = (
    ("input_proj.weight", "weight_ih"),
    ("R", "weight_hh"),
    ("input_proj.bias", "bias_ih"),
    ("b", "bias_hh"),
)


def rename_torch_keys(
    layer: RNN, state_dict: dict[str, Any], prefix: str, error_msgs: list[str]
) -> None:
    """Where ``state_dict`` holds a torch module's keys under ``prefix`` (``weight_ih_l0``,
    ``bias_hh_l1_reverse``, ...), put each under the layer's own name (``weights.0.input_proj.
    weight``, ``weights.3.b``, ...), reshaped to its shape, so that ``load_state_dict`` loads a
    checkpoint of ``nn.LSTM``, ``GRU`` or ``RNN`` into the equal layer. A value of another size
    keeps its shape, and load_state_dict's size check names it; a layer with no torch
    equivalent adds an error to ``error_msgs``."""
    suffixes = _suffixes(layer)
    found = [
        prefix + theirs + sfx
        for sfx in suffixes
        for _, theirs in _TORCH_NAMES
        if prefix + theirs + sfx in state_dict
    ]
    if not found:
        return
    try:
        _torch_kind(layer)
    except ValueError as err:
        error_msgs.append(
            f"{', '.join(found[:2])}{', ...' if len(found) > 2 else ''}: a torch module's keys, "
            f"which load only into a layer equal to it: {err}"
        )
        return
    for k, (weights, sfx) in enumerate(zip(layer.weights, suffixes, strict=True)):
        for ours, theirs in _TORCH_NAMES:
            value = state_dict.get(prefix + theirs + sfx)
            target = _parameter(weights, ours)
            if value is None or target is None:  # a bias the layer lacks stays unexpected
                continue
            del state_dict[prefix + theirs + sfx]
            same = isinstance(value, torch.Tensor) and value.numel() == target.numel()
            state_dict[f"{prefix}weights.{k}.{ours}"] = (
                value.reshape(target.shape) if same else value
            )


_TORCH_WEIGHT = re.compile(r"((weight|bias)_(ih|hh))_l(\d+)(_reverse)?")


def torch_weight(layer: RNN, name: str) -> torch.Tensor | list[list[torch.Tensor]] | None:
    """``layer.weight_hh_l0`` and its kin: a view, in the torch module's shape, of the layer's
    own parameter (so code that reads or initialises ``nn.LSTM``'s weights in place runs), and
    ``all_weights``, torch's list of them per (layer, direction); None where ``name`` is no
    such name. AttributeError for a name the layer lacks or a layer with no torch equivalent."""
    if name == "all_weights":
        names = [t for _, t in _TORCH_NAMES][: 4 if layer.bias else 2]
        views = [[torch_weight(layer, n + sfx) for n in names] for sfx in _suffixes(layer)]
        return cast(list[list[torch.Tensor]], views)
    m = _TORCH_WEIGHT.fullmatch(name)
    if m is None:
        return None
    missing = f"'{type(layer).__name__}' object has no attribute '{name}'"
    if int(m.group(4)) >= layer.num_layers or (m.group(5) and not layer.bidirectional):
        raise AttributeError(missing)
    try:
        _torch_kind(layer)
    except ValueError as err:
        raise AttributeError(
            f"{missing}: torch's weight names need an equal torch module; {err}"
        ) from None
    k, ours = _ours(layer, m)
    found = _parameter(layer.weights[k], ours)
    if found is None:
        raise AttributeError(f"{missing} (bias=False)")
    # torch's shapes: [gates · H, in] (R: [gates, 1, H, H]) and [gates · H]
    return found.view(-1) if m.group(2) == "bias" else found.view(-1, found.shape[-1])


def refuse_torch_weight_assignment(layer: RNN, name: str) -> None:
    """A ``TypeError`` for ``layer.weight_hh_l0 = ...`` (any of torch's weight names): they
    are views of the layer's own parameters, so setting one would only shadow it."""
    m = _TORCH_WEIGHT.fullmatch(name)
    if m is None:
        return
    k, ours = _ours(layer, m)
    raise TypeError(
        f"cannot assign {name}: on rnncc.RNN it is a view of the parameter weights.{k}.{ours} "
        f"in torch's shape; write its values in place (with torch.no_grad(): "
        f"layer.{name}.copy_(value)) or assign layer.weights[{k}].{ours}"
    )


def _ours(layer: RNN, m: re.Match[str]) -> tuple[int, str]:
    """The ``layer.weights`` index and the parameter there that a ``_TORCH_WEIGHT`` match names."""
    k = int(m.group(4)) * layer.num_directions + bool(m.group(5))
    return k, next(o for o, t in _TORCH_NAMES if t == m.group(1))


def _parameter(module: nn.Module, name: str) -> torch.Tensor | None:
    """``module``'s parameter ``name`` (dotted), or None where it has none."""
    try:
        return module.get_parameter(name)
    except AttributeError:
        return None


def _copy(layer: RNN, module: nn.RNNBase, *, to_torch: bool) -> None:
    """Copy every weight between ``layer`` and ``module``, in the direction ``to_torch`` says,
    with its ``requires_grad`` (a frozen weight stays frozen)."""
    with torch.no_grad():
        for w, sfx in zip(layer.weights, _suffixes(layer), strict=True):
            assert isinstance(w, CellWeights) and w.input_proj is not None and w.R is not None
            # to torch, R as the layer runs it (a pruned R's dropped entries zero)
            R = w.masked_R() if to_torch else w.R
            assert R is not None
            pairs = [
                (w.input_proj.weight, w.input_proj.weight, f"weight_ih{sfx}"),
                (w.R, R, f"weight_hh{sfx}"),
            ]
            if layer.bias:
                assert w.input_proj.bias is not None and w.b is not None
                pairs += [
                    (w.input_proj.bias, w.input_proj.bias, f"bias_ih{sfx}"),
                    (w.b, w.b, f"bias_hh{sfx}"),
                ]
            for param, ours, theirs_name in pairs:
                theirs = getattr(module, theirs_name)
                if to_torch:
                    theirs.copy_(ours.reshape(theirs.shape))
                    theirs.requires_grad_(param.requires_grad)
                else:
                    ours.copy_(theirs.reshape(ours.shape))
                    param.requires_grad_(theirs.requires_grad)
