"""Who used an upstream's GPUs over a window, and how evenly (pure).

The inputs are one window's growth of the per-consumer counters (`domain.windows`): each
consumer's prompt, output and prefix-cached tokens and its slot-seconds on one upstream.
From them:

- a consumer's *weighted tokens*: `input + output_token_weight x output`. An output token
  costs the GPU more than a prompt token: decode is memory-bound and makes one token per
  step for each sequence, while prefill runs a whole prompt's tokens in one batched pass;
  2 (the default, `[upstreams.NAME.admission] output_token_weight`) is a rough ratio, to be
  tuned per model and hardware.
- its *service*: weighted tokens divided by its `weight` (keys file), i.e. normalised to
  its entitlement: a weight-3 consumer served 3x a weight-1 one has the same service.
- its shares of the upstream's slot-seconds and weighted tokens in the window.
- Jain's fairness index of the services: (sum x)^2 / (n x sum x^2), from 1/n (one consumer
  got everything) to 1 (all equal). Over the consumers that were served or waited in the
  window, so a consumer that waited and got nothing counts as 0. Fewer than 2 consumers, or
  none served at all: 1.0 (nobody was favoured).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from msgspec import Struct

DEFAULT_OUTPUT_TOKEN_WEIGHT = 2.0


class Use(Struct, kw_only=True):
    """One consumer's use of one upstream over a window; input counts every prompt token,
    `cached_tokens` is the part of it the prefix cache served."""

    input_tokens: float = 0.0
    output_tokens: float = 0.0
    cached_tokens: float = 0.0
    slot_seconds: float = 0.0


class Share(Struct, frozen=True, kw_only=True):
    """A consumer's part of an upstream's window (`shares`)."""

    consumer: str
    use: Use
    weighted_tokens: float  # input + output_token_weight x output
    service: float  # weighted_tokens / the consumer's weight
    token_share: float  # of the upstream's weighted tokens in the window, 0..1
    slot_share: float  # of the upstream's slot-seconds in the window, 0..1


def weighted_tokens(use: Use, output_token_weight: float = DEFAULT_OUTPUT_TOKEN_WEIGHT) -> float:
    return use.input_tokens + output_token_weight * use.output_tokens


def jain_index(values: Iterable[float]) -> float:
    """(sum x)^2 / (n x sum x^2); 1.0 for fewer than 2 values, or when all are 0."""
    total = squares = 0.0
    n = 0
    for x in values:
        total += x
        squares += x * x
        n += 1
    if n < 2 or squares <= 0.0:
        return 1.0
    return min(1.0, total * total / (n * squares))  # min: float rounding may give 1.0000000000000002


def shares(
    uses: Mapping[str, Use], weights: Mapping[str, int], output_token_weight: float = DEFAULT_OUTPUT_TOKEN_WEIGHT,
) -> tuple[list[Share], float]:
    """Each consumer's share of one upstream's window (by name) and Jain's index of their
    services. `uses`: every consumer that was served or waited (a waiter's use is all 0);
    `weights`: the consumers' weights (absent: 1; below 1 counts as 1, as the keys file allows none)."""
    weighted = {name: weighted_tokens(use, output_token_weight) for name, use in uses.items()}
    all_tokens = sum(weighted.values())
    all_slots = sum(use.slot_seconds for use in uses.values())
    out = [
        Share(consumer=name, use=use, weighted_tokens=weighted[name],
              service=weighted[name] / max(1, weights.get(name, 1)),
              token_share=weighted[name] / all_tokens if all_tokens > 0 else 0.0,
              slot_share=use.slot_seconds / all_slots if all_slots > 0 else 0.0)
        for name, use in sorted(uses.items())
    ]
    return out, jain_index(share.service for share in out)
