"""Byte-level BPE tokenizer for the demo family, trained with the `tokenizers` library.

The pre-tokenizer is GPT-2's regex with no prefix space, which is what llama.cpp's
"gpt-2" pre-tokenizer does, so the GGUF export tokenizes exactly like tokenizer.json.
"""

from __future__ import annotations

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

BOS_TOKEN = "<|bos|>"
EOS_TOKEN = "<|eos|>"
SPECIAL_TOKENS = [BOS_TOKEN, EOS_TOKEN]

# The demo models know Python, not conversation: a user turn becomes a comment block the
# model continues with code. Rendered by the Jinja sandbox like any model's template.
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{% if message['role'] == 'assistant' %}{{ message['content'] }}{{ eos_token }}\n"
    "{% else %}{% for line in message['content'].split('\n') %}# {{ line }}\n{% endfor %}"
    "{% endif %}"
    "{% endfor %}"
)


def train_tokenizer(texts: list[str], vocab_size: int) -> Tokenizer:
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer, length=len(texts))
    return tokenizer


def special_ids(tokenizer: Tokenizer) -> tuple[int, int]:
    return tokenizer.token_to_id(BOS_TOKEN), tokenizer.token_to_id(EOS_TOKEN)
