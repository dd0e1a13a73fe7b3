"""Whether an upstream applies a thinking budget, and a request sent without one.

A model server applies a request's thinking budget (`ReasoningConfig.budget_tokens`) only when
it separates the model's thinking from its answer: vLLM does with `--reasoning-parser` (and/or
`--reasoning-config`), and without them refuses every request that carries a budget, before it
generates anything. The rest of a reasoning config (whether to think, an effort level) are the
chat template's inputs, which every server takes.

`[upstreams.NAME] reasoning` says which kind an upstream is: `True` (it serves reasoning: send
the budget), `False` (it does not: never send one), or `"auto"` (find out: send it until the
upstream refuses one, then not for `RECHECK_SECONDS`, then try again, so a server restarted
with a parser is noticed without restarting the gateway).
"""

from __future__ import annotations

from typing import Literal

import msgspec

from domain.canonical import ChatRequest

ReasoningMode = bool | Literal["auto"]
RECHECK_SECONDS = 600.0  # "auto": how long a refusal keeps budgets from an upstream


def has_budget(request: ChatRequest) -> bool:
    """The request asks for a thinking budget."""
    reasoning = request.reasoning
    return reasoning is not None and reasoning.budget_tokens is not None


def without_budget(request: ChatRequest) -> ChatRequest:
    """The request without its thinking budget; the rest of its reasoning config is kept."""
    reasoning = request.reasoning
    if reasoning is None or reasoning.budget_tokens is None:
        return request
    return msgspec.structs.replace(request, reasoning=msgspec.structs.replace(reasoning, budget_tokens=None))


class BudgetSupport:
    """One upstream's answer to "does it apply a thinking budget?": told, or learnt (`"auto"`)."""

    __slots__ = ("_unserved_until", "mode")

    def __init__(self, mode: ReasoningMode) -> None:
        self.mode = mode
        self._unserved_until = float("-inf")  # "auto": budgets held back until then

    def sends(self, now: float) -> bool:
        """Whether a request's budget goes to the upstream now."""
        mode = self.mode
        if mode is True or mode is False:
            return mode
        return now >= self._unserved_until

    def refused(self, now: float) -> bool:
        """The upstream refused a budget. True: it is now known not to apply one (`"auto"`), and
        the request goes again without it; False: the refusal is the answer (`True`: the operator
        said it serves reasoning, so a refusal is a misconfiguration to show)."""
        if self.mode != "auto":
            return False
        self._unserved_until = now + RECHECK_SECONDS
        return True
