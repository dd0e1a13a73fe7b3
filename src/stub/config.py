"""The stub upstream's knobs, one field per command-line option (``stub.cli``)."""

from __future__ import annotations

from dataclasses import dataclass

from stub.faults import DEFAULT_AFTER_TOKENS
from stub.prefix_cache import DEFAULT_CAPACITY
from stub.schema import MAX_MODEL_LEN


@dataclass(frozen=True, slots=True)
class StubConfig:
    """The stub's knobs; see ``stub.cli`` for their meaning."""

    hold: float = 0.0
    tokens: int = 16
    reasoning: bool = False
    error_rate: float = 0.0
    seed: int = 0
    log_path: str | None = None
    log_headers: bool = False  # header names on each --log line (what a gateway forwarded)
    log_bodies: bool = False  # the JSON body received at the end of each --log line
    models: tuple[str, ...] = ()
    chunk_delay: float = 0.0
    stream_usage: bool = True  # False: ignore include_usage, as llama.cpp's server does
    fault: str | None = None  # a kind of stub.faults.KINDS, or "random"
    fault_rate: float = 1.0
    fault_after: int = 0  # chat requests answered normally before the faults begin
    fault_limit: int | None = None  # faults injected at most, then every request is fine
    fault_after_tokens: int = DEFAULT_AFTER_TOKENS  # die-mid-stream: token chunks before the reset
    max_num_seqs: int | None = None  # None: every request generates at once
    prefix_cache: bool = False
    prefix_cache_blocks: int = DEFAULT_CAPACITY
    prefill_ms_per_1k_tokens: float = 50.0  # with prefix_cache: per 1,000 uncached prompt tokens
    max_model_len: int = MAX_MODEL_LEN  # prompt + output tokens of one sequence, as vLLM's --max-model-len
