"""The expr-lang subset evaluator, and the rendered retry expression's verdicts on fixtures."""
from __future__ import annotations

import pytest

from workflows.expr import ExprError, evaluate, retry_env
from workflows.template import RETRY_EXPRESSION, render


def test_operator_precedence_and_short_circuit_on_hand_checked_cases():
    env = {"a": {"b": "7"}, "s": "hello"}
    assert evaluate("1 == 1 || 1 == 2 && 1 == 3", env) is True  # && binds tighter: true || (false && false)
    assert evaluate("(1 == 1 || 1 == 2) && 1 == 3", env) is False
    assert evaluate("!(a.b in ['2', '3'])", env) is True
    assert evaluate("a.b not in ['7']", env) is False
    assert evaluate("asInt(a.b) > 5 and asInt(a.b) <= 7", env) is True
    assert evaluate("s matches '^h.l+o$'", env) is True
    assert evaluate("s matches '(?i)HELLO'", env) is True
    assert evaluate("not (s == 'hello')", env) is False
    # short-circuit: the right side would raise (asInt('x')) if it were evaluated
    assert evaluate("s == 'nope' && asInt('x') > 1", env) is False
    assert evaluate("s == 'hello' || asInt('x') > 1", env) is True


def test_string_escapes_and_both_quote_styles():
    assert evaluate("'it\\'s' == \"it's\"", {}) is True


@pytest.mark.parametrize(
    "text",
    ["a.b + 1", "foo(1)", "a.b ==", "[1, 2", "a ? b : c", "x.y"],
)
def test_unsupported_or_broken_expressions_are_refused(text):
    with pytest.raises(ExprError):
        evaluate(text, {"a": {"b": "1"}})


def test_no_truthiness_and_no_implicit_string_number_comparison():
    with pytest.raises(ExprError):
        evaluate("'1' && true", {})
    with pytest.raises(ExprError):
        evaluate("'10' > 2", {})


def test_retry_env_reports_unknown_exit_code_as_minus_one_like_argo():
    assert retry_env(None, "Error", "pod deleted")["lastRetry"] == {
        "exitCode": "-1", "status": "Error", "duration": "0", "message": "pod deleted",
    }  # fmt: skip


# Fixtures: (exit code, node status, message) as Argo reports them after a failed attempt.
RETRIED = [
    (137, "Failed", "OOMKilled (exit code 137)"),
    (137, "Failed", ""),
    (143, "Failed", "Error (exit code 143)"),
    (1, "Failed", "Error (exit code 1)"),
    (139, "Failed", "Error (exit code 139)"),
    (None, "Error", "pod deleted"),
    (None, "Error", "Pod was evicted: The node was low on resource: memory."),
    (None, "Error", "Pod was terminated in response to imminent node shutdown."),
    (None, "Failed", "Pod was terminated in response to imminent node shutdown."),
    (2, "Error", "pod deleted during container start"),  # exit 2 never retries, even as Error
]
NOT_RETRIED = [
    (2, "Failed", "Error (exit code 2)"),
    (3, "Failed", "Error (exit code 3)"),
]


@pytest.mark.parametrize("code,status,message", RETRIED[:-1])
def test_retry_expression_retries_oom_sigterm_errors_and_pod_loss(code, status, message):
    assert evaluate(RETRY_EXPRESSION, retry_env(code, status, message, 12.0)) is True


@pytest.mark.parametrize("code,status,message", NOT_RETRIED + RETRIED[-1:])
def test_retry_expression_never_retries_bad_input_or_kill_criterion(code, status, message):
    assert evaluate(RETRY_EXPRESSION, retry_env(code, status, message, 12.0)) is False


def test_every_rendered_template_carries_the_evaluated_expression():
    exprs = {t["name"]: t["retryStrategy"]["expression"] for t in render()["spec"]["templates"] if "retryStrategy" in t}
    assert set(exprs) == {"features", "train-fold", "report"}
    assert set(exprs.values()) == {RETRY_EXPRESSION}
