"""A small Hugging Face tokenizer built in the tests (no download): a word-level vocabulary of
made-up words, ChatML's special tokens, and a Jinja chat template in tokenizer_config.json, as a
model directory has them."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

CHATML_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + "
    "'<|im_end|>' + '\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")
SPECIALS = ["[UNK]", "<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def made_up_words(n: int) -> list[str]:
    """``n`` distinct alphabetic words (syllables of a consonant and a vowel, two or more each)."""
    syllables = [c + v for c in "bcdfghjklmnprstvwz" for v in "aeiou"]
    words = []
    for length in itertools.count(2):
        for combo in itertools.product(syllables, repeat=length):
            words.append("".join(combo))
            if len(words) == n:
                return words


def build_tokenizer(directory: Path, vocab_size: int = 2000, template: str | None = CHATML_TEMPLATE,
                    special_tokens: bool = True) -> Path:
    """Write ``tokenizer.json`` (and ``tokenizer_config.json`` with ``template`` unless None) into
    ``directory``; ids 0-3 are the special tokens (plain vocabulary without ``special_tokens``,
    as in a tokenizer that declares none), the rest words. Returns the directory."""
    from tokenizers import Tokenizer, decoders, pre_tokenizers
    from tokenizers.models import WordLevel

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    vocab = {tok: i for i, tok in enumerate(SPECIALS + ["system", "user", "assistant", "tool"])}
    for word in made_up_words(vocab_size - len(SPECIALS)):
        vocab[word] = len(vocab)
    tok = Tokenizer(WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.decoder = decoders.WordPiece(prefix="##", cleanup=False)  # words joined by spaces
    if special_tokens:
        tok.add_special_tokens(SPECIALS)
    tok.save(str(directory / "tokenizer.json"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": None, "eos_token": "<|im_end|>",
              "pad_token": "<|endoftext|>", "unk_token": "[UNK]", "model_max_length": 65536}
    if template is not None:
        config["chat_template"] = template
    (directory / "tokenizer_config.json").write_text(json.dumps(config, indent=1))
    return directory
