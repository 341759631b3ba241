"""A one-character-per-token tokenizer in HuggingFace's format, for AIPerf (benchmarks/peer_aiperf.py):
its `--tokenizer builtin` downloads tiktoken's tables at start, which a machine without that
network cannot, and a real model's tokenizer is a download too. One character a token, so AIPerf's
synthetic prompt of 4N tokens is text the simulator counts as N (ceil(UTF-8 bytes / 4)), and its
decode-and-re-encode to the exact length holds (every character of AIPerf's corpus is in the vocabulary).

    .venv-aiperf/bin/python benchmarks/data/char_tokenizer/make.py benchmarks/data/char_tokenizer
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

# AIPerf's python has these; tailguard's does not.
import aiperf  # type: ignore[import-not-found]
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers  # type: ignore[import-not-found]
from transformers import AutoTokenizer  # type: ignore[import-not-found]


def main(out: Path) -> None:
    corpus = next(Path(aiperf.__file__).parent.rglob("shakespeare.txt"))  # AIPerf's prompt corpus
    chars = sorted(set(corpus.read_text()) | {chr(c) for c in range(32, 127)} | {"\n"})
    tok = Tokenizer(models.WordLevel(vocab={"[UNK]": 0, **{c: i + 1 for i, c in enumerate(chars)}}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("[\\s\\S]"), behavior="isolated")
    tok.decoder = decoders.Fuse()  # the characters back without spaces between them
    out.mkdir(parents=True, exist_ok=True)
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "PreTrainedTokenizerFast", "unk_token": "[UNK]", "model_max_length": 1000000}))
    t = AutoTokenizer.from_pretrained(str(out))
    text = "To be, or not to be:\n that is"
    ids = t.encode(text, add_special_tokens=False)
    assert len(ids) == len(text) and t.decode(ids) == text


if __name__ == "__main__":
    main(Path(sys.argv[1]))
