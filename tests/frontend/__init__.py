"""Tests of ``rnncc.frontend``: diagnostics, accepted syntax, printer round trips."""
