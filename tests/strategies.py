"""Hypothesis strategies shared by the tests: random well-formed cells as source text.

``cell_sources()`` draws a cell with 1–3 states, a projection of 1–3 gates with a random
subset of the terms, optional params and consts, temporaries, and state assignments in a
random order (swaps and reads of new values included). Expressions use every operator and
function, kept inside their domains (``log`` and ``sqrt`` of ``x*x + 1``, division by
``y*y + 1``, ``exp`` of a ``tanh``) so that values stay finite and derivatives defined.
"""

from __future__ import annotations

from hypothesis import strategies as st

_UNARY = ["sigmoid", "tanh", "logsigmoid", "softplus", "relu", "abs", "detach"]
_GUARDED = {
    "log": "log({0} * {0} + 1)",
    "sqrt": "sqrt({0} * {0} + 1)",
    "exp": "exp(tanh({0}))",
    "pow2": "({0}) ** 2",
    "pow3": "({0}) ** 3",
    "powm": "({0} * {0} + 1) ** -1.5",
}
_COMPARE = ["<", "<=", ">", ">=", "==", "!="]


@st.composite
def expressions(draw, names: list[str], depth: int = 3) -> str:
    """A random expression over ``names`` (each a valid reference at the point of use)."""
    if depth == 0 or draw(st.integers(0, 3)) == 0:
        if not names or draw(st.integers(0, 3)) == 0:
            return draw(st.sampled_from(["0.5", "2", "1e-1", "3"]))
        return draw(st.sampled_from(names))
    sub = lambda: draw(expressions(names, depth - 1))  # noqa: E731
    kind = draw(st.integers(0, 6))
    if kind == 0:
        return f"({sub()} {draw(st.sampled_from(['+', '-', '*']))} {sub()})"
    if kind == 1:
        d = sub()
        return f"({sub()} / ({d} * {d} + 1))"
    if kind == 2:
        return f"{draw(st.sampled_from(_UNARY))}({sub()})"
    if kind == 3:
        return _GUARDED[draw(st.sampled_from(sorted(_GUARDED)))].format(sub())
    if kind == 4:
        return f"{draw(st.sampled_from(['max', 'min']))}({sub()}, {sub()})"
    if kind == 5:
        op = draw(st.sampled_from(_COMPARE))
        return f"where({sub()} {op} {sub()}, {sub()}, {sub()})"
    return f"-{sub()}"


@st.composite
def cell_sources(draw) -> str:
    """Source text of one random well-formed cell named ``rand``."""
    n_states = draw(st.integers(1, 3))
    states = ["s0", "s1", "s2"][:n_states]
    n_gates = draw(st.integers(1, 3))
    gates = ["g0", "g1", "g2"][:n_gates]
    terms = draw(
        st.lists(st.sampled_from(["W x", "R s0", "b"]), min_size=1, max_size=3, unique=True)
    )
    lines = [f"gates {', '.join(gates)} = {' + '.join(terms)}"]
    visible = list(states) + list(gates)
    if draw(st.booleans()):
        lines.append("param p0, p1 = 0.5")
        visible += ["p0", "p1"]
    if draw(st.booleans()):
        lines.append("const k = 0.25")
        visible.append("k")
    order = draw(st.permutations(states))
    n_temps = draw(st.integers(0, 2))
    for i in range(n_temps):
        expr = draw(expressions(visible))
        lines.append(f"t{i} = {expr}")
        visible.append(f"t{i}")
    for s in order:
        expr = draw(expressions(visible))
        lines.append(f"{s} = {expr}")
    # Use every gate, param and temporary once more so no "never used" warning fires.
    extra = [g for g in visible if g not in states and g != "k"]
    if extra:
        s = order[-1]
        lines[-1] = lines[-1] + " + 0.01 * (" + " + ".join(extra) + ")"
    body = "\n    ".join(lines)
    state_list = ", ".join(states)
    return f"cell rand({state_list}) {{\n    {body}\n}}\n"
