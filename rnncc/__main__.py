"""``python -m rnncc``: the same program as the ``rnncc`` console script.

Input: the command line. Output: ``rnncc.cli.main``'s return value as the exit status.
Non-goals: any logic of its own; everything lives in ``rnncc.cli``.
"""

from rnncc.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
