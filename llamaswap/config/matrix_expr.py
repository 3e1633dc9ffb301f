"""Matrix set expressions: which models may run together.

The problem. ``[routing.router.settings.matrix]`` lets a user say which models fit on the
hardware at the same time without listing every combination by hand. ``vars`` gives models
short names, and each entry of ``sets`` is an expression over them::

    [routing.router.settings.matrix.vars]
    c = "chat"
    e = "embed"
    k = "coder"

    [routing.router.settings.matrix.sets]
    small = "c & e"            # chat and embed together
    work = "(c | k) & e"       # chat+embed, or coder+embed
    all = "+small | k"         # everything in 'small', or coder alone

The design. A tiny grammar, parsed by recursive descent, with ``&`` binding tighter than
``|`` as in most languages::

    expr   := term ("|" term)*
    term   := factor ("&" factor)*
    factor := NAME | "+" SETNAME | "(" expr ")"

An expression means a list of *combinations* (each a ``frozenset`` of model IDs): a name is
the one combination holding its model, ``|`` concatenates lists, ``&`` takes the product
(the union of one combination from each side), and ``+set`` splices in the other set's
combinations. So ``a & (b | c)`` is ``[{a, b}, {a, c}]``. Expanding to combinations up
front keeps the matrix solver simple: it only ever compares sets of model IDs. Order is kept
(first-defined wins ties) and duplicates are dropped.

Limits. A config is untrusted input, so expansion is bounded: parentheses nest at most
:data:`MAX_NESTING` levels (the parser recurses once per level), a set may expand to at most
:data:`MAX_COMBINATIONS` combinations, and all sets together may take at most
:data:`MAX_STEPS` combination unions to expand. Sets splicing each other are expanded in
dependency order, without recursion, so a long chain of ``+set`` costs nothing extra.

Rejected alternatives: evaluating expressions lazily at swap time (errors would surface on a
request instead of at startup), and a general boolean algebra with negation (no use case;
"any subset may run too" already covers "not").
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import attrs

from llamaswap.keypaths import suggestion

__all__ = [
    "MAX_COMBINATIONS",
    "MAX_NESTING",
    "MAX_STEPS",
    "Combination",
    "MatrixExprError",
    "check_sets",
    "expand_sets",
    "parse_expr",
]

Combination = frozenset[str]
_OPERATORS = "&|()+"
#: How deep parentheses may nest in one expression.
MAX_NESTING = 20
#: How many combinations one set may expand to.
MAX_COMBINATIONS = 1000
#: How many combination unions expanding every set may take (well under a second).
MAX_STEPS = 1_000_000


class MatrixExprError(ValueError):
    """A set expression that cannot be used.

    Attributes:
        set_name: the entry of ``sets`` at fault (``""`` from :func:`parse_expr` alone).
        message: what is wrong, lowercase.
    """

    def __init__(self, message: str, set_name: str = "") -> None:
        self.set_name = set_name
        self.message = message
        super().__init__(f"set {set_name!r}: {message}" if set_name else message)


@attrs.frozen
class Name:
    name: str


@attrs.frozen
class SetRef:
    name: str


@attrs.frozen
class And:
    parts: tuple[Node, ...]


@attrs.frozen
class Or:
    parts: tuple[Node, ...]


Node = Name | SetRef | And | Or


def _tokenize(text: str) -> list[tuple[str, int]]:
    tokens: list[tuple[str, int]] = []
    pos = 0
    while pos < len(text):
        char = text[pos]
        if char.isspace():
            pos += 1
        elif char in _OPERATORS:
            tokens.append((char, pos + 1))
            pos += 1
        else:
            start = pos
            while pos < len(text) and not text[pos].isspace() and text[pos] not in _OPERATORS:
                pos += 1
            tokens.append((text[start:pos], start + 1))
    return tokens


class _Parser:
    def __init__(self, text: str) -> None:
        self.tokens = _tokenize(text)
        self.index = 0
        self.depth = 0  # parentheses open at this point

    def peek(self) -> str | None:
        return self.tokens[self.index][0] if self.index < len(self.tokens) else None

    def where(self) -> str:
        if self.index < len(self.tokens):
            token, column = self.tokens[self.index]
            return f"{token!r} at column {column}"
        return "the end of the expression"

    def take(self) -> str:
        token = self.tokens[self.index][0]
        self.index += 1
        return token

    def expr(self) -> Node:
        parts = [self.term()]
        while self.peek() == "|":
            self.take()
            parts.append(self.term())
        return parts[0] if len(parts) == 1 else Or(tuple(parts))

    def term(self) -> Node:
        parts = [self.factor()]
        while self.peek() == "&":
            self.take()
            parts.append(self.factor())
        return parts[0] if len(parts) == 1 else And(tuple(parts))

    def factor(self) -> Node:
        token = self.peek()
        if token == "(":
            self.take()
            self.depth += 1
            if self.depth > MAX_NESTING:
                raise MatrixExprError(f"parentheses nest more than {MAX_NESTING} levels deep")
            inner = self.expr()
            if self.peek() != ")":
                raise MatrixExprError(f"expected ')' but found {self.where()}")
            self.take()
            self.depth -= 1
            return inner
        if token == "+":
            self.take()
            name = self.peek()
            if name is None or name in _OPERATORS:
                raise MatrixExprError(f"expected a set name after '+' but found {self.where()}")
            return SetRef(self.take())
        if token is None or token in _OPERATORS:
            raise MatrixExprError(f"expected a var name, '+set' or '(' but found {self.where()}")
        return Name(self.take())


def parse_expr(text: str) -> Node:
    """Parse one set expression.

    Raises:
        MatrixExprError: the text is empty or not in the grammar (the message gives the column).
    """
    parser = _Parser(text)
    if parser.peek() is None:
        raise MatrixExprError("the expression is empty")
    node = parser.expr()
    if parser.peek() is not None:
        raise MatrixExprError(f"unexpected {parser.where()}; join names with '&' or '|'")
    return node


def _refs(node: Node) -> list[str]:
    """The sets ``node`` splices in, in order (the tree is as deep as its parentheses)."""
    if isinstance(node, SetRef):
        return [node.name]
    if isinstance(node, Name):
        return []
    return [ref for part in node.parts for ref in _refs(part)]


class _Expander:
    def __init__(self, sets: Mapping[str, str], variables: Mapping[str, str]) -> None:
        self.sets = sets
        self.variables = variables
        self.trees: dict[str, Node] = {}
        self.done: dict[str, tuple[Combination, ...]] = {}
        self.failed: set[str] = set()
        self.errors: list[MatrixExprError] = []
        self.steps = 0

    def fail(self, set_name: str, message: str) -> None:
        self.failed.add(set_name)
        self.errors.append(MatrixExprError(message, set_name))

    def parse_all(self) -> None:
        for set_name, text in self.sets.items():
            try:
                self.trees[set_name] = parse_expr(text)
            except MatrixExprError as exc:
                self.fail(set_name, exc.message)

    def order(self) -> list[str]:
        """The parsed sets, each after the sets it splices in; cycles fail their sets.

        An iterative depth-first search, in definition order: a set on the current path
        that is reached again closes a cycle, reported once, at that set.
        """
        order: list[str] = []
        state: dict[str, bool] = {}  # False: on the current path; True: finished
        for root in self.trees:
            if root in state:
                continue
            path = [root]
            pending = [iter(_refs(self.trees[root]))]
            state[root] = False
            while path:
                for ref in pending[-1]:
                    if ref not in self.trees:
                        continue  # unknown or unparsable: reported where it is used, or not
                    if ref not in state:
                        state[ref] = False
                        path.append(ref)
                        pending.append(iter(_refs(self.trees[ref])))
                        break
                    if not state[ref] and ref not in self.failed:
                        cycle = [*path[path.index(ref) :], ref]
                        self.failed.update(cycle)
                        message = f"sets refer to each other in a cycle: {' -> '.join(cycle)}"
                        self.errors.append(MatrixExprError(message, ref))
                else:
                    state[path[-1]] = True
                    order.append(path.pop())
                    pending.pop()
        return order

    def expand_all(self) -> None:
        self.parse_all()
        for set_name in self.order():
            if set_name in self.failed or self.steps > MAX_STEPS:
                continue  # reported, or out of steps (reported at the set that ran out)
            try:
                result = self.evaluate(self.trees[set_name], set_name)
            except MatrixExprError as exc:
                self.fail(set_name, exc.message)
                continue
            if result is None:
                self.failed.add(set_name)  # it uses an invalid set: reported there
            else:
                self.done[set_name] = result

    def evaluate(self, node: Node, set_name: str) -> tuple[Combination, ...] | None:
        if isinstance(node, Name):
            if node.name not in self.variables:
                hint = suggestion(node.name, self.variables, noun="vars")
                raise MatrixExprError(f"unknown var {node.name!r}; {hint}")
            return (frozenset({self.variables[node.name]}),)
        if isinstance(node, SetRef):
            if node.name not in self.sets:
                others = [name for name in self.sets if name != set_name]
                hint = suggestion(node.name, others, noun="sets")
                raise MatrixExprError(f"unknown set '+{node.name}'; {hint}")
            return self.done.get(node.name)  # expanded before this set, or failed
        results = [self.evaluate(part, set_name) for part in node.parts]
        if any(part is None for part in results):
            return None
        if isinstance(node, Or):
            return self.bounded(combo for part in results for combo in part or ())
        product: tuple[Combination, ...] = (frozenset(),)
        for part in results:
            product = self.bounded(left | right for left in product for right in part or ())
        return product

    def bounded(self, combos: Iterable[Combination]) -> tuple[Combination, ...]:
        """``combos`` without duplicates, within :data:`MAX_COMBINATIONS` and the steps left."""
        unique: dict[Combination, None] = {}
        for combo in combos:
            self.steps += 1
            if self.steps > MAX_STEPS:
                raise MatrixExprError(
                    f"the sets take more than {MAX_STEPS} steps to expand; list fewer alternatives"
                )
            unique[combo] = None
            if len(unique) > MAX_COMBINATIONS:
                raise MatrixExprError(
                    f"expands to more than {MAX_COMBINATIONS} combinations of models; "
                    "list fewer alternatives"
                )
        return tuple(unique)


def check_sets(
    sets: Mapping[str, str], variables: Mapping[str, str]
) -> tuple[dict[str, tuple[Combination, ...]], list[MatrixExprError]]:
    """Expand every set, collecting one error per faulty set instead of stopping.

    Errors come in the sets' definition order. A set that only fails because a set it
    splices in (``+other``) is invalid is left out of the result without an error of its
    own, so each mistake is reported once.

    Args:
        sets: set name → expression, in definition order.
        variables: var name → model ID.

    Returns:
        The valid sets' combinations (in definition order) and the errors.
    """
    expander = _Expander(sets, variables)
    expander.expand_all()
    expanded = {name: expander.done[name] for name in sets if name in expander.done}
    position = {name: index for index, name in enumerate(sets)}
    errors = sorted(expander.errors, key=lambda error: position[error.set_name])
    return expanded, errors


def expand_sets(
    sets: Mapping[str, str], variables: Mapping[str, str]
) -> dict[str, tuple[Combination, ...]]:
    """Every set's combinations of model IDs, in definition order.

    Raises:
        MatrixExprError: for the first invalid set (see :func:`check_sets` for all of them).
    """
    expanded, errors = check_sets(sets, variables)
    if errors:
        raise errors[0]
    return expanded
