"""The one error hierarchy of rnncc.

User errors carry positions and print like a compiler (``file:line:col: error: ...``,
the source line, a caret under the span); internal errors print the IR that broke.

    RnnccError
    ├── DslError          errors in a ``.rnn`` source (syntax and semantics), all at once
    │   └── DslSyntaxError
    ├── CellSelectionError  no (or an unknown) cell chosen from a file of several (a ValueError)
    ├── TilingError       no tiling plan fits the problem on the device
    ├── BuildError        the generated sources did not compile
    └── InternalError     a bug in rnncc: an invariant of the IR does not hold
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Span:
    """A region of a source file; lines and columns count from 1, ``end_col`` is exclusive."""

    line: int
    col: int
    end_line: int
    end_col: int

    def __repr__(self) -> str:
        return f"{self.line}:{self.col}-{self.end_line}:{self.end_col}"


@dataclass(frozen=True)
class Source:
    """A source text and the name it is reported under (a path or ``<string>``)."""

    text: str
    path: str = "<string>"

    def line(self, number: int) -> str:
        lines = self.text.splitlines()
        return lines[number - 1] if 0 < number <= len(lines) else ""


@dataclass(frozen=True)
class Diagnostic:
    """One message about a source: an error or a warning, with optional notes."""

    severity: str  # "error" | "warning"
    message: str
    span: Span | None
    source: Source
    notes: tuple[str, ...] = field(default=())

    def render(self) -> str:
        if self.span is None:
            out = [f"{self.source.path}: {self.severity}: {self.message}"]
        else:
            sp = self.span
            out = [f"{self.source.path}:{sp.line}:{sp.col}: {self.severity}: {self.message}"]
            text = self.source.line(sp.line).expandtabs(1)
            out.append(f"    {text}")
            end = sp.end_col if sp.end_line == sp.line else len(text) + 1
            width = max(1, end - sp.col)
            out.append("    " + " " * (sp.col - 1) + "^" + "~" * (width - 1))
        out.extend(f"note: {n}" for n in self.notes)
        return "\n".join(out)


class RnnccError(Exception):
    """Base of every error rnncc raises on purpose."""


class DslError(RnnccError):
    """One or more errors in a ``.rnn`` source; ``diagnostics`` holds all of them."""

    def __init__(self, diagnostics: list[Diagnostic] | tuple[Diagnostic, ...]):
        self.diagnostics = tuple(diagnostics)
        super().__init__("\n".join(d.render() for d in self.diagnostics))


class DslSyntaxError(DslError):
    """The source does not parse; every diagnostic is a syntax error."""


class CellSelectionError(RnnccError, ValueError):
    """A file holds several cells and none, or an unknown one, was chosen."""


class TilingError(RnnccError):
    """No tiling plan satisfies the constraints; the message names the binding ones."""


class BuildError(RnnccError):
    """A generated source failed to compile; the message names the file and first errors."""


class InternalError(RnnccError):
    """A bug in rnncc: an IR invariant failed. The message carries the IR involved."""


class RnnccWarning(UserWarning):
    """Warnings of rnncc: unused declarations in a cell, slow fallbacks, a damaged cache entry
    rebuilt."""
