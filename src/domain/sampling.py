"""The vLLM sampling parameters a client may set beyond the canonical ones: an allowlist.

Only what is modelled here (and in `ChatRequest` / `CompletionRequest`) reaches an upstream;
every other member a client sends is dropped at the edge (SECURITY.md, "What the edge
forwards"). Each parameter is one that costs the model server nothing beyond the sequences
and tokens the gateway already counts, and each is bounded: the `Annotated` types below are
what the dialects decode with, so a value out of bounds is a 400 naming its field.

Never forwarded from a client, whatever the dialect: `priority` (vLLM's scheduling order),
`request_id` (the engine's request id), `kv_transfer_params`, `chat_template`, `cache_salt`
(the gateway sets its own per consumer, `domain.cache_salt`), and anything not named here.
"""

from __future__ import annotations

from typing import Annotated, Any

from msgspec import Meta, Struct

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
MAX_LOGIT_BIAS = 300  # OpenAI's own bound on `logit_bias` entries
MAX_GUIDED_CHOICES = 256
MAX_GUIDED_REGEX_CHARS = 4096
MAX_GUIDED_CHOICE_CHARS = 512
MAX_TOP_LOGPROBS = 20  # OpenAI's bound
MAX_TOP_K = 1_000_000  # above any vocabulary; -1 and 0 mean "all tokens" to vLLM
MAX_TEMPLATE_KWARGS = 32  # keys of `chat_template_kwargs`
MAX_TEMPLATE_KWARGS_BYTES = 16 * 1024

TopK = Annotated[int, Meta(ge=-1, le=MAX_TOP_K)]
MinP = Annotated[float, Meta(ge=0, le=1)]
RepetitionPenalty = Annotated[float, Meta(gt=0, le=10)]
Penalty = Annotated[float, Meta(ge=-2, le=2)]  # presence / frequency
Seed = Annotated[int, Meta(ge=INT64_MIN, le=INT64_MAX)]
TokenId = Annotated[str, Meta(pattern=r"^[0-9]{1,10}$")]
Bias = Annotated[float, Meta(ge=-100, le=100)]
LogitBias = Annotated[dict[TokenId, Bias], Meta(max_length=MAX_LOGIT_BIAS)]
TopLogprobs = Annotated[int, Meta(ge=0, le=MAX_TOP_LOGPROBS)]
GuidedChoice = Annotated[
    list[Annotated[str, Meta(max_length=MAX_GUIDED_CHOICE_CHARS)]], Meta(min_length=1, max_length=MAX_GUIDED_CHOICES)
]
GuidedRegex = Annotated[str, Meta(max_length=MAX_GUIDED_REGEX_CHARS)]


class Sampling(Struct, kw_only=True):
    """Optional sampling and structured-output parameters; None: the upstream's default.

    `response_format`, `structured_outputs` and `guided_json` are JSON documents (a schema,
    a grammar) whose size the edge bounds as received, like a tool's schema
    (`[server] max_tool_schema_bytes`).
    """

    min_p: float | None = None
    repetition_penalty: float | None = None
    seed: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    response_format: dict[str, Any] | None = None
    structured_outputs: dict[str, Any] | None = None
    guided_json: dict[str, Any] | str | None = None
    guided_choice: list[str] | None = None
    guided_regex: str | None = None

    def fields(self) -> list[tuple[str, Any]]:
        """(name, value) of every parameter set, as the upstream body names them."""
        if self == _NONE_SET:  # most requests set none: one comparison in C, not eleven getattr calls
            return []
        return [(name, value) for name in _FIELDS if (value := getattr(self, name)) is not None]


_FIELDS: tuple[str, ...] = Sampling.__struct_fields__
_NONE_SET = Sampling()
