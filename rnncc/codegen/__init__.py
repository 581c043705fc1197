"""Code generation: cell IR → CUDA sources.

``expr`` (IR expressions → float32 C), ``templates`` (the Jinja environment),
``stepwise`` (the per-step pointwise kernels of the stepwise backend).
"""
