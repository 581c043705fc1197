"""The runtime: the callable cell object, its backends and the ``nn.Module``.

``api`` (``load``/``loads`` → ``CompiledCell``), ``validate`` (input checks),
``reference`` (the torch backend and its autograd), ``module`` (``RNN``).
"""
