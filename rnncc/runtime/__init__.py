"""The runtime: the callable cell object, its backends and the ``nn.Module``.

``api`` (``load``/``loads``/``load_builtin`` → ``CompiledCell``), ``validate`` (input
checks), ``reference`` (the torch backend and its autograd), ``module`` (``RNN``),
``torch_compat`` (``RNN`` from and to ``torch.nn.LSTM``/``GRU``/``RNN``).
"""
