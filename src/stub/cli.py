"""Command line of the stub upstream; the gateway's ``gateway stub`` subcommand reuses it.

The option names are a contract (operators and acceptance tests rely on them); see
``docs/design.md`` "Stub upstream".
"""

from __future__ import annotations

import argparse
import math
import sys

from stub.config import StubConfig
from stub.faults import DEFAULT_AFTER_TOKENS, DIE_MID_STREAM, KINDS, RANDOM
from stub.prefix_cache import BLOCK_TOKENS, DEFAULT_CAPACITY
from stub.schema import MAX_MODEL_LEN
from stub.server import run_server

FAULT_HELP = (
    "inject a failure into chat answers: reset-before-headers (TCP reset, no answer), "
    "reset-mid-stream (part of the answer, then a reset), stall-before-headers (no answer until "
    "the client leaves), stall-mid-stream (part of the answer, then silence), malformed-sse "
    "(a non-JSON data: frame mid-stream; non-stream: a non-JSON body), http-4xx (400 in vLLM's "
    "error shape: context length exceeded), http-5xx (500 in vLLM's shape), http-5xx-html (502 with an "
    "ingress's HTML page naming an internal address), truncated (the stream "
    "ends without finish_reason and [DONE]; non-stream: no finish_reason), die-mid-stream (a replica "
    "killed mid-answer: the first --fault-after-tokens token chunks, then a reset; non-stream: a reset "
    "before any answer; the one kind that also strikes /v1/completions), or random (one of "
    "these per faulty chat request)"
)


def _non_negative(text: str) -> float:
    value = float(text)
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0, got {text!r}")
    return value


def _fraction(text: str) -> float:
    value = float(text)
    if not 0 <= value <= 1:
        raise argparse.ArgumentTypeError(f"must be between 0 and 1, got {text!r}")
    return value


def _count(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be an integer >= 0, got {text!r}")
    return value


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1, got {text!r}")
    return value


def parse_listen(text: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:PORT`` for IPv6) -> (host, port)."""
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise argparse.ArgumentTypeError(f"expected HOST:PORT, got {text!r}")
    return host.strip("[]"), int(port)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Declare the stub's options on ``parser`` (a subparser of ``gateway`` or standalone)."""
    parser.add_argument(
        "--listen",
        required=True,
        type=parse_listen,
        metavar="HOST:PORT",
        help="address to listen on (port 0: any free port, printed at start)",
    )
    parser.add_argument(
        "--hold",
        type=_non_negative,
        default=0.0,
        metavar="SECONDS",
        help="wait before the first byte of each chat answer (default 0)",
    )
    parser.add_argument(
        "--tokens",
        type=_count,
        default=16,
        metavar="N",
        help="length in tokens of the deterministic answer (default 16)",
    )
    parser.add_argument(
        "--reasoning",
        action="store_true",
        help="serve reasoning as vLLM with --reasoning-parser does: reasoning text (vLLM's `reasoning` "
        "field), cut after a request's thinking_token_budget tokens; without it a budget is refused "
        "(400, or the first frame of a stream), as vLLM refuses it",
    )
    parser.add_argument(
        "--error-rate",
        type=_fraction,
        default=0.0,
        metavar="P",
        help="fraction of chat requests answered at once with HTTP 500",
    )
    parser.add_argument("--seed", type=int, default=0,
                        help="seed of the --error-rate and --fault draws (default 0)")  # fmt: skip
    parser.add_argument(
        "--log",
        metavar="PATH",
        default=None,
        help="truncated at start; one line per started chat request with "
        "in_flight=N max_concurrent=M, flushed at once",
    )
    parser.add_argument(
        "--log-headers",
        action="store_true",
        help="add headers=a,b,... to each --log line: the names (never the values) of the "
        "request headers received, lower-case, in order",
    )
    parser.add_argument(
        "--log-bodies",
        action="store_true",
        help="end each --log line with body= and the JSON body received (compact): what a gateway "
        "forwarded, exactly",
    )
    parser.add_argument(
        "--models",
        default=None,
        metavar="A,B",
        help="model ids served and listed (default: accept any, list 'stub')",
    )
    parser.add_argument("--no-usage", action="store_true",
                        help="never send usage in a stream, whatever stream_options.include_usage says "
                        "(as llama.cpp's server does)")  # fmt: skip
    parser.add_argument("--chunk-delay", type=_non_negative, default=0.0, metavar="SECONDS",
                        help="delay between the token chunks of a stream; the finish chunk, usage and [DONE] "
                        "follow the last token at once, as vLLM sends them (default 0)")  # fmt: skip
    parser.add_argument("--fault", choices=(*KINDS, RANDOM), default=None, metavar="KIND", help=FAULT_HELP)
    parser.add_argument("--fault-rate", type=_fraction, default=None, metavar="P",
                        help="fraction of chat requests given the --fault (default 1 when --fault is set)")  # fmt: skip
    parser.add_argument("--fault-after", type=_count, default=None, metavar="N",
                        help="answer the first N chat requests (with die-mid-stream: chat and text completion "
                        "requests) normally, then the --fault (default 0)")  # fmt: skip
    parser.add_argument("--fault-limit", type=_count, default=None, metavar="N",
                        help="inject the --fault into N requests at most, then answer every request normally: "
                        "with --fault-after A, requests A+1.. are faulty (at --fault-rate) until N faults were "
                        "injected (default: no limit; --fault-limit 1: the first request fails, the next ones "
                        "are fine)")  # fmt: skip
    parser.add_argument("--fault-after-tokens", type=_count, default=None, metavar="N",
                        help="with --fault die-mid-stream (or random): the token chunks a stream sends before "
                        f"the reset; reasoning tokens count (default {DEFAULT_AFTER_TOKENS})")  # fmt: skip
    parser.add_argument("--max-num-seqs", type=_positive, default=None, metavar="N",
                        help="like vLLM's: at most N sequences generate at once (a request for n choices is n; "
                        "chat and text completions), the others wait inside the stub in arrival order (--log lines add "
                        "waiting=W seqs=S; GET /metrics serves vllm:num_requests_running, "
                        "vllm:num_requests_waiting, vllm:num_requests_waiting_by_reason and vllm:kv_cache_usage_perc, "
                        "labelled engine and model_name as vLLM 0.32 does); default: no limit")  # fmt: skip
    parser.add_argument("--prefix-cache", action="store_true",
                        help="like vLLM's automatic prefix caching: keep the prompt blocks served (LRU); a "
                        "request's first token waits --prefill-ms-per-1k-tokens per 1,000 uncached prompt "
                        "tokens (plus --hold); usage reports prompt_tokens_details.cached_tokens and --log "
                        "lines add prompt_tokens=P cached_tokens=C")  # fmt: skip
    parser.add_argument("--prefill-ms-per-1k-tokens", type=_non_negative, default=50.0, metavar="MS",
                        help="with --prefix-cache: prefill ms per 1,000 uncached tokens (default 50)")  # fmt: skip
    parser.add_argument("--max-model-len", type=_positive, default=MAX_MODEL_LEN, metavar="N",
                        help="like vLLM's: prompt plus output tokens of one sequence (a token is a word of the "
                        "stub's). A chat prompt of N tokens or more is refused with vLLM 0.32's 400 (over N: "
                        "'at least N+1 input tokens', the count stopping there, while /tokenize counts it all); "
                        "a max_tokens over the room left is shortened to fit, not refused; reported by "
                        f"/v1/models and /tokenize (default {MAX_MODEL_LEN})")  # fmt: skip
    parser.add_argument("--prefix-cache-blocks", type=_positive, default=DEFAULT_CAPACITY, metavar="N",
                        help=f"with --prefix-cache: blocks of {BLOCK_TOKENS} tokens kept "
                        f"(default {DEFAULT_CAPACITY})")  # fmt: skip


def config_from_args(args: argparse.Namespace) -> StubConfig:
    models = tuple(m.strip() for m in (args.models or "").split(",") if m.strip())
    rate = 1.0 if args.fault_rate is None else args.fault_rate
    if args.fault is None and args.fault_rate is not None:
        raise SystemExit("stub: --fault-rate needs --fault KIND")
    if args.fault is None and args.fault_after is not None:
        raise SystemExit("stub: --fault-after needs --fault KIND")
    if args.fault is None and args.fault_limit is not None:
        raise SystemExit("stub: --fault-limit needs --fault KIND")
    if args.fault_after_tokens is not None and args.fault not in (DIE_MID_STREAM, RANDOM):
        raise SystemExit(f"stub: --fault-after-tokens needs --fault {DIE_MID_STREAM} (or {RANDOM})")
    after_tokens = DEFAULT_AFTER_TOKENS if args.fault_after_tokens is None else args.fault_after_tokens
    return StubConfig(hold=args.hold, tokens=args.tokens, reasoning=args.reasoning,
                      error_rate=args.error_rate, seed=args.seed, log_path=args.log,
                      log_headers=args.log_headers, log_bodies=args.log_bodies, stream_usage=not args.no_usage,
                      models=models, chunk_delay=args.chunk_delay,
                      fault=args.fault, fault_rate=rate, fault_after=args.fault_after or 0,
                      fault_limit=args.fault_limit, fault_after_tokens=after_tokens,
                      max_num_seqs=args.max_num_seqs, prefix_cache=args.prefix_cache,
                      prefix_cache_blocks=args.prefix_cache_blocks,
                      prefill_ms_per_1k_tokens=args.prefill_ms_per_1k_tokens,
                      max_model_len=args.max_model_len)  # fmt: skip


def run(args: argparse.Namespace) -> int:
    """Run a vLLM-compatible stub upstream until SIGINT/SIGTERM; returns the exit status."""
    host, port = args.listen
    try:
        run_server(config_from_args(args), host, port)
    except OSError as exc:
        print(f"stub: cannot start on {host}:{port}: {exc}", file=sys.stderr, flush=True)
        return 1
    return 0
