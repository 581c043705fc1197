"""Source text → AST: the Lark LALR parser, the newline postlexer and the tree transformer.

Syntax errors become ``DslSyntaxError`` with one diagnostic per bad statement: after an
error, the offending line is blanked and the text parsed again, so a file with several typos
reports them all at once (up to a limit). Lines that open or close a cell are never blanked
(that would only cascade), so an error there ends the search, as does an unexpected end of
file. Keywords are reserved everywhere, also where the contextual lexer expects only a name.

The parser is built on first use and cached; importing this module does no work.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import re
from collections.abc import Iterator
from typing import Any

from lark import Lark, Token, Transformer_NonRecursive, v_args
from lark.exceptions import UnexpectedCharacters, UnexpectedInput, UnexpectedToken, VisitError
from lark.tree import Meta

from rnncc.errors import Diagnostic, DslSyntaxError, Source, Span
from rnncc.frontend import ast
from rnncc.resources import grammar_path

MAX_SYNTAX_ERRORS = 20
KEYWORDS = ("cell", "gates", "input", "recurrent", "param", "const", "output", "inf")

_TERMINAL_TEXT = {
    "NAME": "a name",
    "NUMBER": "a number",
    "INF": "'inf'",
    "SIGN": "a sign",
    "_SEP": "a newline|';'",
    "$END": "the end of the file",
    "ADD_OP": "'+'|'-'",  # '|' separates alternatives listed one by one
    "MUL_OP": "'*'|'/'",
    "COMP_OP": "a comparison",
    "LPAR": "'('",
    "RPAR": "')'",
    "LBRACE": "'{'",
    "RBRACE": "'}'",
    "COMMA": "','",
    "EQUAL": "'='",
    "PLUS": "'+'",
    "MINUS": "'-'",
    "__ANON_0": "'**'",
}


class _ParenNewlines:
    """Postlexer: newlines inside parentheses are not statement ends (';' still is).

    It also gives keywords their own token type wherever they appear: the contextual lexer
    would otherwise lex ``output`` as a NAME in a state that accepts only names, so that
    ``cell f(output)`` slipped through instead of being reported as a reserved word.
    """

    always_accept = ("_SEP",)

    def process(self, stream: Iterator[Token]) -> Iterator[Token]:
        depth = 0
        for tok in stream:
            if tok.type == "NAME" and tok in KEYWORDS:
                tok = Token.new_borrow_pos(str(tok).upper(), tok, tok)
            if tok.type == "LPAR":
                depth += 1
            elif tok.type == "RPAR":
                depth = max(0, depth - 1)
            elif tok.type == "_SEP" and depth > 0 and not _has_semicolon(tok):
                continue
            yield tok


def _has_semicolon(sep: str) -> bool:
    """Whether a separator token (newlines, ';' and the comments between them) holds a ';'
    outside its comments."""
    return ";" in re.sub(r"#[^\n]*", "", sep)


@functools.cache
def _parser() -> Lark:
    return Lark(
        grammar_path().read_text(),
        parser="lalr",
        lexer="contextual",
        postlex=_ParenNewlines(),
        propagate_positions=True,
        maybe_placeholders=True,
    )


def _span(meta_or_tok: object) -> Span:
    m = meta_or_tok
    return Span(m.line, m.column, m.end_line, m.end_column)  # type: ignore[attr-defined]


def _ident(tok: Token) -> ast.Ident:
    return ast.Ident(str(tok), _span(tok))


def _number(text: str) -> float:
    return float(text)


@v_args(meta=True)
class _ToAst(Transformer_NonRecursive[Token, ast.Module]):
    """Lark tree → ``rnncc.frontend.ast`` nodes (iteratively: a long sum such as
    ``h + h + ... + h`` is a deep left-nested tree that would overflow Python's stack)."""

    def start(self, meta: Meta, children: list[Any]) -> ast.Module:
        return ast.Module(tuple(c for c in children if c is not None))

    def cell(self, meta: Meta, children: list[Any]) -> ast.CellDef:
        name, *rest = children
        states = tuple(c for c in rest if isinstance(c, ast.InitItem))
        body = tuple(c for c in rest if c is not None and not isinstance(c, ast.InitItem))
        return ast.CellDef(_ident(name), states, body, _span(meta))

    def state_decl(self, meta: Meta, children: list[Any]) -> ast.InitItem:
        name, value = children
        return ast.InitItem(_ident(name), value, _span(meta))

    init_item = state_decl

    def signed_number(self, meta: Meta, children: list[Any]) -> ast.Number:
        sign, tok = children
        value = float("inf") if tok.type == "INF" else _number(tok)
        value = -value if sign is not None and sign == "-" else value
        return ast.Number(value, _span(meta), f"{sign or ''}{tok}")

    def projection(self, meta: Meta, children: list[Any]) -> ast.Projection:
        kw, *rest = children
        names = tuple(_ident(c) for c in rest if isinstance(c, Token))
        terms = tuple(c for c in rest if isinstance(c, ast.Term))
        return ast.Projection(str(kw), names, terms, _span(meta))

    def proj_kw(self, meta: Meta, children: list[Token]) -> Token:
        return children[0]

    def term2(self, meta: Meta, children: list[Any]) -> ast.Term:
        return ast.Term((_ident(children[0]), _ident(children[1])), _span(meta))

    def term1(self, meta: Meta, children: list[Any]) -> ast.Term:
        return ast.Term((_ident(children[0]),), _span(meta))

    def param_decl(self, meta: Meta, children: list[Any]) -> ast.ParamDecl:
        return ast.ParamDecl(tuple(children), _span(meta))

    def const_decl(self, meta: Meta, children: list[Any]) -> ast.ConstDecl:
        return ast.ConstDecl(tuple(children), _span(meta))

    def output_decl(self, meta: Meta, children: list[Any]) -> ast.OutputDecl:
        return ast.OutputDecl(tuple(_ident(c) for c in children), _span(meta))

    def assign(self, meta: Meta, children: list[Any]) -> ast.Assign:
        target, value = children
        return ast.Assign(_ident(target), value, _span(meta))

    def compare(self, meta: Meta, children: list[Any]) -> ast.Compare:
        left, op, right = children
        return ast.Compare(str(op), left, right, _span(meta))

    def binary(self, meta: Meta, children: list[Any]) -> ast.Binary:
        left, op, right = children
        return ast.Binary(str(op), left, right, _span(meta))

    def pow(self, meta: Meta, children: list[Any]) -> ast.Binary:
        left, right = children
        return ast.Binary("**", left, right, _span(meta))

    def neg(self, meta: Meta, children: list[Any]) -> ast.Neg:
        return ast.Neg(children[0], _span(meta))

    def number(self, meta: Meta, children: list[Any]) -> ast.Number:
        return ast.Number(_number(children[0]), _span(meta), str(children[0]))

    def inf(self, meta: Meta, children: list[Any]) -> ast.Number:
        return ast.Number(float("inf"), _span(meta), "inf")

    def name(self, meta: Meta, children: list[Any]) -> ast.Name:
        return ast.Name(_ident(children[0]))

    def call(self, meta: Meta, children: list[Any]) -> ast.Call:
        func, *args = children
        return ast.Call(_ident(func), tuple(a for a in args if a is not None), _span(meta))


_CLOSERS = ("')'", "'}'")


def _describe_expected(expected: set[str] | frozenset[str]) -> str:
    texts = (_TERMINAL_TEXT.get(e, f"'{e.lower()}'") for e in expected)
    # Closing brackets first: when the list is cut short, they are the likeliest fix.
    words = sorted(
        {w for text in texts for w in text.split("|")}, key=lambda w: (w not in _CLOSERS, w)
    )
    if len(words) > 8:
        return ", ".join(words[:8]) + ", ..."
    return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " or " + words[-1]


def _describe_token(tok: Token) -> str:
    if tok.type == "$END":
        return "end of file"
    if tok.type == "_SEP":
        return "';'" if _has_semicolon(tok) else "end of line"
    return f"'{tok}'"


#: The keywords that start a statement, and the note for a first word that is none of them.
_STATEMENTS = ("gates", "input", "recurrent", "param", "const", "output")
_STATEMENT_NOTE = (
    "a statement is 'name = expression' or starts with "
    + ", ".join(_STATEMENTS[:-1])
    + f" or {_STATEMENTS[-1]}",
)


def _statement_word(tok: Token, err: UnexpectedToken, source: Source) -> re.Match[str] | None:
    """The first word of ``tok``'s line where ``tok`` is a name that follows it alone, where
    the parser wanted '=' (that word as an assignment's target): a misspelt keyword."""
    if tok.type != "NAME" or "EQUAL" not in err.expected or tok.line is None or tok.column is None:
        return None
    return re.search(r"(?:^|[;{])\s*(\w+)\s+$", source.line(tok.line)[: tok.column - 1])


def _is_header(tok: Token, source: Source) -> bool:
    """Whether the ``cell`` token ``tok`` starts a cell header (``cell name(``)."""
    rest = source.line(tok.line or 1)[(tok.column or 1) - 1 :]
    return re.match(r"cell\s+\w+\s*\(", rest) is not None


def _open_cell(source: Source, line: int) -> tuple[str, int] | None:
    """The name and line of the last cell header before ``line``."""
    for n in range(line - 1, 0, -1):
        header = re.match(r"\s*cell\s+(\w+)", source.line(n))
        if header:
            return header[1], n
    return None


def _acceptable(err: UnexpectedToken) -> set[str]:
    """The terminals the parser takes where ``err`` stopped it (lark tries each on a copy of
    its state), or LALR's expected set where lark gives no parser to ask."""
    parser = getattr(err, "interactive_parser", None)
    accepted = set(parser.accepts()) if parser is not None else set()
    return accepted or set(err.expected)


def _syntax_diagnostic(err: UnexpectedInput, source: Source) -> Diagnostic:
    if isinstance(err, UnexpectedToken):
        tok = err.token
        if tok.type == "$END":
            # just after the last non-blank text, not on trailing blank lines; lines end at
            # '\n' only, as the parser counts them
            text = source.text.rstrip()
            line, col = text.count("\n") + 1, len(text) - text.rfind("\n")
            span = Span(line, col, line, col + 1)
        else:
            span = _span(tok)
            if tok.type == "_SEP":  # point at the end of the line, not at the next one
                span = Span(tok.line, tok.column, tok.line, tok.column + 1)
        # what the parser would take here: LALR's lookahead sets (err.expected) also name
        # terminals that only a reduction's lookahead allows ('}' after `c = 1` in a header)
        acceptable = _acceptable(err)
        expected = acceptable - {"_SEP"} if tok.type != "_SEP" else acceptable
        # `output = h`: the keyword lexes as the statement keyword, the error comes at '='.
        before = re.search(r"\b(\w+)\s*$", source.line(tok.line)[: tok.column - 1])
        if tok == "=" and "NAME" in err.expected and before and before[1] in KEYWORDS:
            span = Span(tok.line, before.start(1) + 1, tok.line, before.end(1) + 1)
            msg = f"'{before[1]}' is a reserved word and cannot be used as a name"
        elif tok.type == "CELL" and "RBRACE" in err.expected and _is_header(tok, source):
            # a cell's closing brace forgotten: the next cell's header comes where a statement
            # or '}' may; say which cell is open, not that 'cell' cannot be a name
            msg = "unexpected 'cell'; expected '}'"
            opened = _open_cell(source, tok.line or 1)
            notes = (
                (f"cell '{opened[0]}' opened at line {opened[1]} is not closed",) if opened else ()
            )
            return Diagnostic("error", msg, span, source, notes)
        elif str(tok) in KEYWORDS and "NAME" in err.expected:
            msg = f"'{tok}' is a reserved word and cannot be used as a name"
        elif (word := _statement_word(tok, err, source)) is not None:
            # `gate a = W x`: a name where '=' must follow the line's first word, which is
            # then no keyword; say so at that word rather than "expected '='" at the next.
            span = Span(tok.line, word.start(1) + 1, tok.line, word.end(1) + 1)
            msg = f"unknown statement '{word[1]}'"
            close = difflib.get_close_matches(word[1].lower(), _STATEMENTS, n=1, cutoff=0.6)
            notes = (f"did you mean '{close[0]}'?",) if close else _STATEMENT_NOTE
            return Diagnostic("error", msg, span, source, notes)
        else:
            msg = f"unexpected {_describe_token(tok)}; expected {_describe_expected(expected or acceptable)}"
        return Diagnostic("error", msg, span, source)
    if isinstance(err, UnexpectedCharacters):
        pos = err.pos_in_stream
        assert pos is not None  # the lexer always reports where it stopped
        char = source.text[pos] if pos < len(source.text) else "?"
        span = Span(err.line, err.column, err.line, err.column + 1)
        msg = f"unexpected character {char!r}"
        # what the parser takes here (the lexer's set also holds lookahead-only terminals)
        parser = getattr(err, "interactive_parser", None)
        allowed = (set(parser.accepts()) if parser is not None else set()) or set(err.allowed or ())
        if allowed:
            msg += f"; expected {_describe_expected(allowed)}"
        notes = (
            ("names are ASCII letters, digits and '_'",)
            if char.isalpha() and not char.isascii()
            else ()
        )
        return Diagnostic("error", msg, span, source, notes)
    line, col = getattr(err, "line", 1), getattr(err, "column", 1)
    return Diagnostic("error", str(err).splitlines()[0], Span(line, col, line, col + 1), source)


def _blank_line(text: str, line: int) -> str | None:
    """``text`` with the statement on ``line`` blanked (every line it spans, where parentheses
    carry it over several), so that the parser can go on to the next error; None where that
    would blank a cell's header or braces (the search ends there)."""
    lines = text.split("\n")
    if not 0 < line <= len(lines):
        return None
    depth, starts = 0, []  # the parentheses open at each line's start
    for content in lines:
        starts.append(depth)
        code = content.split("#", 1)[0]
        depth = max(0, depth + code.count("(") - code.count(")"))
    starts.append(depth)
    first = line
    while first > 1 and starts[first - 1] > 0:
        first -= 1
    last = line
    while last < len(lines) and starts[last] > 0:
        last += 1
    for n in range(first, last + 1):
        content = lines[n - 1]
        if re.search(r"[{}]", content) or re.match(r"\s*cell\b(?!\s*=)", content):
            return None
    if not any(lines[n - 1].strip() for n in range(first, last + 1)):
        return None
    for n in range(first, last + 1):
        lines[n - 1] = " " * len(lines[n - 1])
    return "\n".join(lines)


def _parses(text: str) -> bool:
    try:
        _parser().parse(text)
    except UnexpectedInput:
        return False
    return True


def parse(source: Source) -> ast.Module:
    """Parse a whole file; raises ``DslSyntaxError`` with every syntax error found."""
    diagnostics: list[Diagnostic] = []
    text = source.text
    while True:
        try:
            tree = _parser().parse(text)
            break
        except UnexpectedInput as err:
            diag = _syntax_diagnostic(err, source)
            diagnostics.append(diag)
            assert diag.span is not None
            # Blanking a line cannot supply what a file that ends too early lacks, nor a cell
            # header's missing '{' (every line after it would be reported again).
            ends = isinstance(err, UnexpectedToken) and (
                err.token.type == "$END" or set(err.expected) <= {"LBRACE", "_SEP"}
            )
            blanked = None if ends else _blank_line(text, diag.span.line)
            if blanked is not None and len(diagnostics) >= MAX_SYNTAX_ERRORS:
                if not _parses(blanked):  # there are more: say the list is cut
                    stop = f"stopped after {MAX_SYNTAX_ERRORS} syntax errors; fix these first"
                    diagnostics[-1] = dataclasses.replace(diag, notes=(*diag.notes, stop))
                raise DslSyntaxError(diagnostics) from None
            if blanked is None:
                raise DslSyntaxError(diagnostics) from None
            text = blanked
    if diagnostics:
        raise DslSyntaxError(diagnostics)
    try:
        return _ToAst().transform(tree)
    except VisitError as err:  # a bug in the transformer, not in the user's text
        raise err.orig_exc from None
