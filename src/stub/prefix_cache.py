"""`--prefix-cache`: vLLM's automatic prefix caching, as far as timing and usage show it.

vLLM keeps the KV blocks of prompts it has computed, keyed by a hash chain over the
prompt's full blocks (each block's hash covers every token before it), and evicts the
least recently used. A request whose leading blocks are cached skips their prefill:
it starts sooner and reports them as `usage.prompt_tokens_details.cached_tokens`.
The stub keeps the same chain over its own token ids (`schema.token_ids`) in an LRU
of `capacity` blocks; only the prefill time (`--prefill-ms-per-1k-tokens` per 1,000
uncached prompt tokens) is simulated.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

BLOCK_TOKENS = 16  # vLLM's default --block-size
DEFAULT_CAPACITY = 8192  # blocks: 131,072 tokens


class PrefixCache:
    """LRU of served prompt blocks, by chained block hash."""

    __slots__ = ("_blocks", "capacity")

    def __init__(self, capacity: int = DEFAULT_CAPACITY) -> None:
        self.capacity = capacity
        self._blocks: OrderedDict[int, None] = OrderedDict()

    def serve(self, tokens: Sequence[int]) -> int:
        """How many of `tokens` were cached (whole leading blocks); the prompt's blocks are kept.

        As in vLLM, the prompt's last token is always computed (its logits start the
        answer), so a fully cached prompt still reports one block less than its length
        when that length is a multiple of the block size.
        """
        blocks = self._blocks
        chain: list[int] = []
        parent = 0
        for start in range(0, len(tokens) - BLOCK_TOKENS + 1, BLOCK_TOKENS):
            parent = hash((parent, *tokens[start : start + BLOCK_TOKENS]))
            chain.append(parent)
        hits = 0
        for key in chain:
            if key not in blocks:
                break
            hits += 1
        if hits and hits * BLOCK_TOKENS >= len(tokens):
            hits -= 1  # the last token is recomputed
        for key in chain:  # most recently used last; new blocks join
            blocks[key] = None
            blocks.move_to_end(key)
        while len(blocks) > self.capacity:
            blocks.popitem(last=False)
        return hits * BLOCK_TOKENS
