"""The Jinja environment of the code generator.

Templates live in the top-level ``templates/`` folder (``rnncc.resources.templates_dir``).
The environment is strict (``StrictUndefined``: a missing variable is an error, not an empty
string), trims block lines, and is built on first use.
"""

from __future__ import annotations

import functools
from typing import Any

import jinja2

from rnncc.resources import templates_dir


@functools.cache
def environment() -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(templates_dir())),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        autoescape=False,
    )


def render_template(name: str, **context: Any) -> str:
    return environment().get_template(name).render(**context)


def read_template(name: str) -> str:
    """A template or header file's text, as shipped."""
    return (templates_dir() / name).read_text()
