"""A small byte-level BPE tokenizer trained on the demo text, for the ``hf_tokenizer`` transform."""
from __future__ import annotations

import sys
from pathlib import Path

from .text import nbytes

TOKENIZER_FILE = "tokenizer.json"
DEMO_VOCAB_SIZE = 4096
TOKENIZER_SAMPLE_BYTES = 4 * 1024 * 1024   # trained on at most this much text: ~1 s on two cores
SPECIAL_TOKENS = ("<|endoftext|>",)         # id 0: the configs' default pad_token_id


def _tokenizer_sample(texts: dict[str, list[str]], budget: int = TOKENIZER_SAMPLE_BYTES) -> list[str]:
    """An equal byte share of every source: its first rows (they are in random order already)."""
    share = budget // max(1, len(texts))
    sample = []
    for rows in texts.values():
        used = 0
        for text in rows:
            if used >= share:
                break
            sample.append(text)
            used += nbytes(text)
    return sample


def train_demo_tokenizer(texts: list[str], vocab_size: int = DEMO_VOCAB_SIZE):
    """A byte-level BPE (GPT-2 style, no prefix space: decoding gives the text back exactly)
    trained on ``texts``; a ``tokenizers.Tokenizer``. Raises ImportError without ``tokenizers``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, min_frequency=2, special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tokenizer.train_from_iterator(texts, trainer)
    return tokenizer


def write_tokenizer(out: Path, texts: dict[str, list[str]]) -> Path | None:
    """Train the demo tokenizer on a sample of ``texts``; write ``out/tokenizer.json``. Without the
    ``tokenizers`` package: print a note, write nothing and return None."""
    try:
        tokenizer = train_demo_tokenizer(_tokenizer_sample(texts))
    except ImportError:
        print(f"note: the 'tokenizers' package is not installed, so no {TOKENIZER_FILE} was written "
              f"(the Parquet data was); the 'hf_tokenizer' transform and configs/demo_bpe.yaml need "
              f"it: pip install tokenizers", file=sys.stderr)
        return None
    path = out / TOKENIZER_FILE
    out.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(path))
    return path


# ---------------------------------------------------------------------------------------------
# Writing.
# ---------------------------------------------------------------------------------------------
