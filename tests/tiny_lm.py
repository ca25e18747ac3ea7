"""A tiny random causal language model, saved as a Hugging Face model directory, built
offline (no hub): a byte-level BPE tokenizer trained here on a few sentences and a 2-layer
GPT-2 with random weights. It writes nonsense, fast, through the real `transformers` code.

`build_tiny_lm` writes three directories beside each other:
- `main`: a chat template, and no EOS token, so every generation runs to its token limit
  (lengths in tests are exact, whatever the random weights prefer);
- `plain`: the same model without a chat template (chat falls back to `role: text` lines);
- `eos`: the same model whose generation config names as EOS a token that greedy decoding
  from `EOS_PROMPT` produces (first as its `eos_after`-th token, at least the 2nd), so greedy
  generation stops right there.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

__all__ = ["EOS_PROMPT", "TinyLM", "build_tiny_lm"]

CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
EOS_PROMPT = "the quick brown fox"

_CORPUS = [
    "the quick brown fox jumps over the lazy dog",
    "hello world, this is a tiny model that says nothing useful",
    "a river of stone runs quiet and bright under the green window",
    "<|user|>hi there\n<|assistant|>hello, how can I help?\n",
    "<|system|>be brief\n<|user|>what is the answer?\n<|assistant|>forty two.\n",
    "numbers 0 1 2 3 4 5 6 7 8 9 and signs . , ! ? : ; - ( )",
]


@dataclass(frozen=True)
class TinyLM:
    main: Path
    plain: Path
    eos: Path
    context: int
    eos_after: int
    """Greedy generation from EOS_PROMPT on `eos` samples EOS as its token number eos_after."""


def build_tiny_lm(root: Path, context: int = 1024) -> TinyLM:
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast

    # The alphabet is only what the corpus uses (ASCII), so every token decodes to whole
    # characters and streamed text is readable; the tokenizer has no special tokens at all.
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    bpe.train_from_iterator(_CORPUS * 4, trainers.BpeTrainer(vocab_size=300, show_progress=False))
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=bpe)
    config = GPT2Config(
        vocab_size=len(tokenizer),
        n_positions=context,
        n_embd=32,
        n_layer=2,
        n_head=2,
        bos_token_id=None,
        eos_token_id=None,
    )
    torch.manual_seed(1234)
    model = GPT2LMHeadModel(config).eval()

    main = root / "main"
    model.save_pretrained(main)
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(main)

    plain = root / "plain"
    shutil.copytree(main, plain)
    (plain / "chat_template.jinja").unlink(missing_ok=True)
    tokenizer_config = json.loads((plain / "tokenizer_config.json").read_text())
    tokenizer_config.pop("chat_template", None)
    (plain / "tokenizer_config.json").write_text(json.dumps(tokenizer_config))

    eos = root / "eos"
    shutil.copytree(main, eos)
    ids = tokenizer(EOS_PROMPT)["input_ids"]
    greedy: list[int] = []
    with torch.inference_mode():
        for _ in range(16):
            logits = model(input_ids=torch.tensor([ids + greedy])).logits[0, -1]
            greedy.append(int(logits.argmax()))
    # The first token greedy decoding has not produced before, past the first one.
    at = next(k for k in range(1, len(greedy)) if greedy[k] not in greedy[:k])
    generation = json.loads((eos / "generation_config.json").read_text())
    generation["eos_token_id"] = greedy[at]
    (eos / "generation_config.json").write_text(json.dumps(generation))
    return TinyLM(main, plain, eos, context, eos_after=at + 1)
