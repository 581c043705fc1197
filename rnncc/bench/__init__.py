"""``rnncc bench``: time a cell on rnncc's backends and on the baselines (see ``command``)."""

from rnncc.bench.command import *  # noqa: F403
