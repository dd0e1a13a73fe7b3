"""`domain.reasoning`: whether an upstream applies a thinking budget, told or learnt."""

from __future__ import annotations

from domain.canonical import ChatRequest, ReasoningConfig
from domain.reasoning import RECHECK_SECONDS, BudgetSupport, has_budget, without_budget


def request(reasoning: ReasoningConfig | None) -> ChatRequest:
    return ChatRequest(model="m", messages=[], reasoning=reasoning)


def test_without_budget_keeps_the_rest_of_the_reasoning_config() -> None:
    asked = request(ReasoningConfig(enabled=True, budget_tokens=64, effort="high"))
    assert has_budget(asked)
    dropped = without_budget(asked)
    assert dropped.reasoning == ReasoningConfig(enabled=True, effort="high") and not has_budget(dropped)
    assert asked.reasoning is not None and asked.reasoning.budget_tokens == 64  # not changed in place
    plain = request(ReasoningConfig(enabled=False))
    assert without_budget(plain) is plain and not has_budget(plain) and not has_budget(request(None))


def test_told_modes_never_change() -> None:
    served, unserved = BudgetSupport(True), BudgetSupport(False)
    assert served.sends(0) and not unserved.sends(0)
    assert not served.refused(0) and not unserved.refused(0)  # a refusal is the answer
    assert served.sends(1) and not unserved.sends(10**9)


def test_auto_holds_budgets_back_after_a_refusal_then_tries_again() -> None:
    support = BudgetSupport("auto")
    assert support.sends(100.0)
    assert support.refused(100.0)  # send it again without the budget
    assert not support.sends(100.0) and not support.sends(100.0 + RECHECK_SECONDS - 1)
    assert support.sends(100.0 + RECHECK_SECONDS)
