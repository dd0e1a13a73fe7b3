"""Make the tiny model the real-vLLM tests serve: seeded, local, nothing downloaded.

Runs in vLLM's own virtualenv (it needs torch, transformers and tokenizers):

    .venv-vllm/bin/python tests/support/vllm/make_model.py OUT_DIR

What it writes is a Hugging Face model folder vLLM loads as it loads any Llama:

- a byte-level BPE tokenizer of 4,096 tokens trained on text this script writes from a
  fixed seed (every byte is encodable, so any client text tokenizes), with the special
  tokens a ChatML-style template, the hermes tool parser and a `<think>` reasoning parser
  look for;
- a Jinja chat template (system, user, assistant, tool turns; tools offered hermes-style;
  with `enable_thinking` the answer starts inside `<think>`, as DeepSeek-R1's does);
- a 6-layer Llama (hidden 768, 58M parameters, 233 MB) with seeded random weights. Its size
  sets its pace: about 45 tokens/s per sequence on one core here, a GPU's pace for the models
  the gateway fronts, which leaves the other core to vLLM's API server, the gateway and the
  clients (a smaller model streams so fast that they, not vLLM, set the pace). It never picks an
  end-of-sequence token, a special token or a token that is not whole UTF-8 text by itself:
  every answer is exactly `max_tokens` long and every token is text at once, which makes usage
  and stream tests exact. One residual dimension is a constant (the embeddings set it, no
  layer writes to it), so after the final norm it is always positive; the output rows of the
  tokens it must never pick weigh only that dimension, negatively, and "}" weighs it a little,
  positively: greedy answers are "}}}}...", and a forced tool call ends at once.

The same seed gives the same files, so two processes (replicas) serve the same model.
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

SEED = 40
VOCAB = 4096
HIDDEN = 768
CONSTANT_DIM = 0
CONSTANT = 4.0
BRACE_BIAS = 1.5  # "}"'s logit then about 5, above any other (they stay under about 2)
MAX_POSITIONS = 2048

BOS, EOS, PAD = "<s>", "</s>", "<pad>"
IM_START, IM_END = "<|im_start|>", "<|im_end|>"
# Not special (they stay in the decoded text, where the parsers look for them).
MARKERS = ["<tool_call>", "</tool_call>", "<think>", "</think>", "<tool_response>", "</tool_response>"]

CHAT_TEMPLATE = (Path(__file__).parent / "chat_template.jinja").read_text()

WORDS = (
    "the a an of to in and or is are was were be been it this that these those with for on at by "
    "from as not no yes all any some each every many much more most few less least one two three "
    "four five six seven eight nine ten hundred thousand first last next new old good bad long "
    "short high low big small large little great right left same other own such only just also "
    "very well then now here there when where why how what which who whom whose can could may "
    "might must shall should will would do does did done make made take took give gave get got "
    "go went come came see saw know knew think thought say said tell told ask asked use used find "
    "found want need try call work seem feel leave put mean keep let begin help show hear play run "
    "move live believe bring happen write sit stand lose pay meet include continue set learn change "
    "lead understand watch follow stop create speak read allow add spend grow open walk win offer "
    "remember love consider appear buy wait serve die send expect build stay fall cut reach kill "
    "remain suggest raise pass sell require report decide pull model token request answer stream "
    "queue slot gateway server client replica cache prefix prompt message system user assistant "
    "tool function argument result error limit count time second minute hour day week year data "
    "file line word text number value name type list table key field input output weather city "
    "temperature forecast search query price order item user account email address phone code "
    "python json http api route upstream downstream admission capacity latency throughput memory"
).split()


def corpus(rng: random.Random) -> list[str]:
    """Text to train the tokenizer on: sentences, JSON, numbers and code-like lines."""
    lines = []
    for _ in range(6000):
        words = [rng.choice(WORDS) for _ in range(rng.randint(4, 18))]
        if rng.random() < 0.3:
            words[0] = words[0].capitalize()
        lines.append(" ".join(words) + rng.choice([".", "?", "!", ",", ":", ""]))
    for _ in range(1500):
        key, value = rng.choice(WORDS), rng.choice(WORDS)
        lines.append(json.dumps({key: value, "n": rng.randint(0, 10**6), "x": round(rng.random() * 100, 2)}))
    for _ in range(800):
        lines.append(f"def {rng.choice(WORDS)}_{rng.choice(WORDS)}({rng.choice(WORDS)}): return {rng.randint(0, 999)}")
    lines.append(CHAT_TEMPLATE)
    return lines


def make_tokenizer(out: Path, rng: random.Random) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB,
        special_tokens=[PAD, BOS, EOS, IM_START, IM_END],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(corpus(rng), trainer=trainer)
    tokenizer.add_tokens(MARKERS)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, bos_token=BOS, eos_token=EOS, pad_token=PAD,
        additional_special_tokens=[IM_START, IM_END],
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.model_max_length = MAX_POSITIONS
    fast.save_pretrained(out)
    (out / "chat_template.jinja").write_text(CHAT_TEMPLATE)


def make_weights(out: Path) -> None:
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(out)
    vocab = len(tokenizer)
    special = {tokenizer.convert_tokens_to_ids(t) for t in [PAD, BOS, EOS, IM_START, IM_END, *MARKERS]}
    # Bytes that are not whole UTF-8 characters: vLLM holds text back until a character is
    # complete, and a lone continuation byte never completes, so one such token early in an
    # answer would hold back the whole rest of the stream until its end.
    partial = {i for i in range(vocab) if "\ufffd" in tokenizer.decode([i])}
    never = sorted(special | partial)
    torch.manual_seed(SEED)
    config = LlamaConfig(
        vocab_size=vocab, hidden_size=HIDDEN, intermediate_size=3072, num_hidden_layers=6,
        num_attention_heads=6, num_key_value_heads=2, max_position_embeddings=MAX_POSITIONS,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id, tie_word_embeddings=False, torch_dtype="float32",
    )
    model = LlamaForCausalLM(config)
    with torch.no_grad():
        model.model.embed_tokens.weight[:, CONSTANT_DIM] = CONSTANT
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight[CONSTANT_DIM, :] = 0.0
            layer.mlp.down_proj.weight[CONSTANT_DIM, :] = 0.0
        head = model.lm_head.weight
        head[:, CONSTANT_DIM] = 0.0
        for token in never:
            head[token, :] = 0.0
            head[token, CONSTANT_DIM] = -100.0
        # Greedy decoding prefers "}" wherever it may stand: a forced tool call (vLLM's grammar
        # lets its arguments be any JSON value) then ends as soon as it can, with arguments
        # that are a number, not an object, as vLLM 0.32 was seen to answer with a real model.
        head[tokenizer.convert_tokens_to_ids("}"), CONSTANT_DIM] = BRACE_BIAS
    model.save_pretrained(out, safe_serialization=True)
    model.generation_config.save_pretrained(out)


def main() -> None:
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    make_tokenizer(out, random.Random(SEED))
    make_weights(out)
    print(out)


if __name__ == "__main__":
    main()
