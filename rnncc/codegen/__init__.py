"""Code generation: cell IR → CUDA sources.

``expr`` (IR expressions → float32 C), ``templates`` (the Jinja environment), ``source`` (the
generated file of a variant's library: the struct ``Cell`` with the cell's hooks, on the
variant's hand-written skeleton ``templates/<variant>.cuh``), ``escape`` (user text as C and
Python literals).
"""
