"""A small evaluator for the subset of Argo's expression language (expr-lang) used by retryStrategy.

Argo evaluates `retryStrategy.expression` with expr-lang (github.com/expr-lang/expr) against
`lastRetry.{exitCode,status,duration,message}`; all four are strings there ("-1" when the exit
code is unknown). The local runner must decide retries exactly as the cluster would, so it runs
the expression rendered into the WorkflowTemplate through this evaluator, and the tests pin the
expression's verdicts on fixtures with it.

Supported grammar (anything else raises ExprError, so an expression that would silently behave
differently locally is refused rather than guessed at):

    or      := and (('||' | 'or') and)*
    and     := not (('&&' | 'and') not)*
    not     := ('!' | 'not') not | cmp
    cmp     := primary (('==' | '!=' | '<' | '<=' | '>' | '>=' | 'in' | 'not in' | 'matches') primary)?
    primary := string | int | 'true' | 'false' | name('.' name)* | name '(' args ')' | '[' items ']' | '(' or ')'

Functions: asInt, asFloat, string, lower, upper. `matches` is a regular-expression search (Go RE2
and Python `re` agree on the constructs used: alternation, `(?i)`, literals).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Callable, Mapping

__all__ = ["ExprError", "evaluate", "parse", "retry_env"]


class ExprError(ValueError):
    """The expression uses syntax or names outside the supported subset, or a runtime type error."""


_TOKEN = re.compile(
    r"""\s*(?:
        (?P<str>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*')
      | (?P<num>\d+(?:\.\d+)?)
      | (?P<op>&&|\|\||==|!=|<=|>=|<|>|!|\(|\)|\[|\]|,|\.)
      | (?P<name>[A-Za-z_][A-Za-z0-9_]*)
    )""",
    re.VERBOSE,
)


@dataclass(frozen=True)
class _Tok:
    kind: str  # "str" | "num" | "op" | "name" | "end"
    value: Any


def _tokenize(text: str) -> list[_Tok]:
    toks: list[_Tok] = []
    pos = 0
    while pos < len(text):
        if text[pos:].strip() == "":
            break
        m = _TOKEN.match(text, pos)
        if m is None or m.end() == pos:
            raise ExprError(f"unsupported character at offset {pos} in expression {text!r}")
        pos = m.end()
        kind = m.lastgroup
        raw = m.group(kind)
        if kind == "str":
            # expr-lang string literals use Go escapes; unicode_escape covers \" \' \\ \n \t.
            value: Any = raw[1:-1].encode("utf-8").decode("unicode_escape")
        elif kind == "num":
            value = float(raw) if "." in raw else int(raw)
        else:
            value = raw
        toks.append(_Tok(kind, value))
    toks.append(_Tok("end", None))
    return toks


def _as_int(x: Any) -> int:
    if isinstance(x, bool):
        raise ExprError(f"asInt: cannot convert bool {x!r}")
    try:
        return int(x) if not isinstance(x, str) else int(x.strip())
    except (TypeError, ValueError):
        try:
            return int(float(x))
        except (TypeError, ValueError):
            raise ExprError(f"asInt: cannot convert {x!r}") from None


def _as_float(x: Any) -> float:
    try:
        return float(x)
    except (TypeError, ValueError):
        raise ExprError(f"asFloat: cannot convert {x!r}") from None


_FUNCS: dict[str, Callable[..., Any]] = {
    "asInt": _as_int,
    "asFloat": _as_float,
    "string": str,
    "lower": lambda s: str(s).lower(),
    "upper": lambda s: str(s).upper(),
}

Node = tuple  # ("lit", v) | ("var", path) | ("call", f, args) | ("list", items) | ("un", op, x) | ("bin", op, a, b)


class _Parser:
    def __init__(self, text: str):
        self.text = text
        self.toks = _tokenize(text)
        self.i = 0

    def peek(self, k: int = 0) -> _Tok:
        return self.toks[min(self.i + k, len(self.toks) - 1)]

    def take(self) -> _Tok:
        tok = self.toks[self.i]
        self.i += 1
        return tok

    def expect(self, value: str) -> None:
        tok = self.take()
        if tok.value != value or tok.kind not in ("op", "name"):
            raise ExprError(f"expected {value!r}, got {tok.value!r} in expression {self.text!r}")

    def is_(self, *values: str) -> bool:
        tok = self.peek()
        return tok.kind in ("op", "name") and tok.value in values

    def parse(self) -> Node:
        node = self.or_()
        if self.peek().kind != "end":
            raise ExprError(f"unexpected {self.peek().value!r} in expression {self.text!r}")
        return node

    def or_(self) -> Node:
        node = self.and_()
        while self.is_("||", "or"):
            self.take()
            node = ("bin", "||", node, self.and_())
        return node

    def and_(self) -> Node:
        node = self.not_()
        while self.is_("&&", "and"):
            self.take()
            node = ("bin", "&&", node, self.not_())
        return node

    def not_(self) -> Node:
        # `not in` is a comparison operator, so `not` here is prefix only when not followed by `in`.
        if self.is_("!") or (self.is_("not") and not (self.peek(1).value == "in")):
            self.take()
            return ("un", "!", self.not_())
        return self.cmp()

    def cmp(self) -> Node:
        left = self.primary()
        if self.is_("==", "!=", "<", "<=", ">", ">=", "in", "matches"):
            op = self.take().value
            return ("bin", op, left, self.primary())
        if self.is_("not") and self.peek(1).value == "in":
            self.take()
            self.take()
            return ("un", "!", ("bin", "in", left, self.primary()))
        return left

    def primary(self) -> Node:
        tok = self.take()
        if tok.kind in ("str", "num"):
            return ("lit", tok.value)
        if tok.kind == "op" and tok.value == "(":
            node = self.or_()
            self.expect(")")
            return node
        if tok.kind == "op" and tok.value == "[":
            items: list[Node] = []
            while not self.is_("]"):
                items.append(self.or_())
                if not self.is_("]"):
                    self.expect(",")
            self.take()
            return ("list", items)
        if tok.kind == "name":
            if tok.value in ("true", "false"):
                return ("lit", tok.value == "true")
            if self.is_("("):
                if tok.value not in _FUNCS:
                    raise ExprError(f"unsupported function {tok.value!r} in expression {self.text!r}")
                self.take()
                args: list[Node] = []
                while not self.is_(")"):
                    args.append(self.or_())
                    if not self.is_(")"):
                        self.expect(",")
                self.take()
                return ("call", tok.value, args)
            path = [tok.value]
            while self.is_("."):
                self.take()
                name = self.take()
                if name.kind != "name":
                    raise ExprError(f"expected a field name after '.' in expression {self.text!r}")
                path.append(name.value)
            return ("var", tuple(path))
        raise ExprError(f"unexpected {tok.value!r} in expression {self.text!r}")


def parse(text: str) -> Node:
    """Parse `text` into a tree; raises ExprError outside the supported subset."""
    return _Parser(text).parse()


def _eval(node: Node, env: Mapping[str, Any]) -> Any:
    kind = node[0]
    if kind == "lit":
        return node[1]
    if kind == "var":
        cur: Any = env
        for part in node[1]:
            if not isinstance(cur, Mapping) or part not in cur:
                raise ExprError(f"unknown name {'.'.join(node[1])!r}")
            cur = cur[part]
        return cur
    if kind == "list":
        return [_eval(x, env) for x in node[1]]
    if kind == "call":
        return _FUNCS[node[1]](*[_eval(a, env) for a in node[2]])
    if kind == "un":
        return not _truth(_eval(node[2], env))
    op, a = node[1], node[2]
    # && and || short-circuit as in expr-lang, so `x != '' && asInt(x) > 1` never converts ''.
    if op == "&&":
        return _truth(_eval(a, env)) and _truth(_eval(node[3], env))
    if op == "||":
        return _truth(_eval(a, env)) or _truth(_eval(node[3], env))
    left, right = _eval(a, env), _eval(node[3], env)
    if op == "==":
        return left == right
    if op == "!=":
        return left != right
    if op == "in":
        if not isinstance(right, list):
            raise ExprError(f"'in' needs an array on the right, got {right!r}")
        return left in right
    if op == "matches":
        if not isinstance(left, str) or not isinstance(right, str):
            raise ExprError(f"'matches' needs strings, got {left!r} matches {right!r}")
        return re.search(right, left) is not None
    if type(left) is str or type(right) is str:
        if type(left) is not type(right):
            raise ExprError(f"cannot compare {left!r} {op} {right!r} (expr-lang has no implicit conversion)")
    return {"<": left < right, "<=": left <= right, ">": left > right, ">=": left >= right}[op]


def _truth(x: Any) -> bool:
    if not isinstance(x, bool):
        raise ExprError(f"expected a bool, got {x!r} (expr-lang has no truthiness)")
    return x


def evaluate(text: str, env: Mapping[str, Any]) -> Any:
    """Evaluate expression `text` against `env` (nested mappings for dotted names)."""
    return _eval(parse(text), env)


def retry_env(exit_code: int | None, status: str, message: str = "", duration_s: float = 0.0) -> dict:
    """The `lastRetry` variables as Argo exposes them: all strings, exit code "-1" when unknown."""
    return {
        "lastRetry": {
            "exitCode": "-1" if exit_code is None else str(exit_code),
            "status": status,
            "duration": str(int(duration_s)),
            "message": message,
        }
    }
