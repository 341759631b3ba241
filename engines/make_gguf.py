"""Write a tiny llama-architecture GGUF with random weights that can never end a generation early.

Why: llama-server needs a model, nothing can be downloaded here, and a test of `max_tokens` or a
benchmark of output lengths needs a model whose replies are exactly as long as asked. Random weights
would sample end-of-sequence now and then; this model cannot, by construction:

- residual channel 0 is constant: every token embedding has 1 there, and the rows of every
  attention-output and FFN-down matrix that write into channel 0 are zero, so no layer changes it;
- after the final RMS norm that channel is therefore always clearly positive, and every token that
  must never be produced (unknown, BOS, EOS and the 256 byte-fallback tokens) has a large negative
  output weight on it and zero elsewhere: its logit sits tens of units below any other token's.

Generated text is made of the plain word pieces only, so every token decodes to printable ASCII.
The file is cached by its parameters; prints the path. Run with the project venv (needs `gguf`).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from model_text import CHATML_TEMPLATE, FORBIDDEN_LOGIT_WEIGHT, WORDS  # beside this script

FORMAT_VERSION = 1  # bump when the construction changes, so cached files are rebuilt
CONSTANT_CHANNEL = 0


@dataclass(frozen=True, slots=True)
class Shape:
    n_embd: int = 64
    n_layer: int = 2
    n_head: int = 4
    n_ff: int = 128
    n_ctx: int = 8192
    seed: int = 0


DEFAULT = Shape()
# `tiny` decodes thousands of tokens/s (fast tests); `slow` (28M parameters) tens to hundreds, so a
# request is still running when a test disconnects from it or a benchmark queues behind it.
PRESETS = {"tiny": DEFAULT, "slow": Shape(n_embd=512, n_layer=8, n_head=8, n_ff=1408)}


def vocabulary() -> tuple[list[str], list[float], list[int]]:
    """SPM pieces: unk, BOS, EOS, 256 byte tokens, then word pieces with every prefix (so merges reach them)."""
    from gguf import TokenType

    tokens = ["<unk>", "<s>", "</s>"]
    types = [TokenType.UNKNOWN, TokenType.CONTROL, TokenType.CONTROL]
    tokens += [f"<0x{b:02X}>" for b in range(256)]
    types += [TokenType.BYTE] * 256
    pieces: list[str] = []
    seen: set[str] = set()

    def add(p: str) -> None:
        if p not in seen:
            seen.add(p)
            pieces.append(p)

    add("\u2581")
    for ch in "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.,!?'-:;()":
        add(ch)
        add("\u2581" + ch)
    for w in WORDS:
        full = "\u2581" + w
        for k in range(2, len(full) + 1):
            add(full[:k])
    tokens += pieces
    types += [TokenType.NORMAL] * len(pieces)
    # Higher score merges first in llama.cpp's SPM tokenizer: prefer longer pieces.
    scores = [0.0] * 259 + [float(len(p)) - i * 1e-4 for i, p in enumerate(pieces)]
    return tokens, scores, [int(t) for t in types]


def build(path: Path, shape: Shape) -> None:
    import gguf

    tokens, scores, types = vocabulary()
    n_vocab = len(tokens)
    forbidden = np.array([t != gguf.TokenType.NORMAL for t in types])
    rng = np.random.default_rng(shape.seed)

    def rand(*dims: int, scale: float = 0.02) -> np.ndarray:
        return (rng.standard_normal(dims) * scale).astype(np.float32)

    c = CONSTANT_CHANNEL
    embd = rand(n_vocab, shape.n_embd, scale=0.5)
    embd[:, c] = 1.0
    out = rand(n_vocab, shape.n_embd, scale=0.5)
    out[:, c] = 0.0
    out[forbidden, :] = 0.0
    out[forbidden, c] = FORBIDDEN_LOGIT_WEIGHT

    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name("tailguard-tiny-random")
    w.add_context_length(shape.n_ctx)
    w.add_embedding_length(shape.n_embd)
    w.add_block_count(shape.n_layer)
    w.add_feed_forward_length(shape.n_ff)
    w.add_head_count(shape.n_head)
    w.add_head_count_kv(shape.n_head)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_dimension_count(shape.n_embd // shape.n_head)
    w.add_rope_freq_base(10000.0)
    w.add_vocab_size(n_vocab)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_unk_token_id(0)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_add_bos_token(True)
    w.add_add_eos_token(False)
    w.add_chat_template(CHATML_TEMPLATE)

    w.add_tensor("token_embd.weight", embd)
    w.add_tensor("output_norm.weight", np.ones(shape.n_embd, dtype=np.float32))
    w.add_tensor("output.weight", out)
    for i in range(shape.n_layer):
        p = f"blk.{i}."
        attn_out = rand(shape.n_embd, shape.n_embd)
        attn_out[c, :] = 0.0  # nothing writes into the constant channel
        ffn_down = rand(shape.n_embd, shape.n_ff)
        ffn_down[c, :] = 0.0
        w.add_tensor(p + "attn_norm.weight", np.ones(shape.n_embd, dtype=np.float32))
        w.add_tensor(p + "attn_q.weight", rand(shape.n_embd, shape.n_embd, scale=0.2))
        w.add_tensor(p + "attn_k.weight", rand(shape.n_embd, shape.n_embd, scale=0.2))
        w.add_tensor(p + "attn_v.weight", rand(shape.n_embd, shape.n_embd, scale=0.2))
        w.add_tensor(p + "attn_output.weight", attn_out)
        w.add_tensor(p + "ffn_norm.weight", np.ones(shape.n_embd, dtype=np.float32))
        w.add_tensor(p + "ffn_gate.weight", rand(shape.n_ff, shape.n_embd, scale=0.2))
        w.add_tensor(p + "ffn_up.weight", rand(shape.n_ff, shape.n_embd, scale=0.2))
        w.add_tensor(p + "ffn_down.weight", ffn_down)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def model_path(cache: Path, shape: Shape) -> Path:
    key = hashlib.sha256(repr((FORMAT_VERSION, asdict(shape))).encode()).hexdigest()[:12]
    return cache / f"tiny-llama-{shape.n_embd}x{shape.n_layer}-{key}.gguf"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cache", type=Path,
                    default=Path(os.environ.get("TAILGUARD_CACHE", Path.home() / ".cache" / "tailguard")) / "models")
    ap.add_argument("--preset", choices=sorted(PRESETS), default="tiny")
    ap.add_argument("--n-embd", type=int, help="override the preset's width")
    ap.add_argument("--n-layer", type=int, help="override the preset's depth")
    ap.add_argument("--n-head", type=int)
    ap.add_argument("--n-ff", type=int)
    ap.add_argument("--seed", type=int)
    args = ap.parse_args(argv)
    base = PRESETS[args.preset]
    shape = Shape(
        n_embd=args.n_embd or base.n_embd, n_layer=args.n_layer or base.n_layer, n_head=args.n_head or base.n_head,
        n_ff=args.n_ff or base.n_ff, seed=base.seed if args.seed is None else args.seed,
    )
    path = model_path(args.cache, shape)
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        try:
            build(tmp, shape)
            tmp.replace(path)  # atomic: a half-written file never looks cached
        finally:
            tmp.unlink(missing_ok=True)
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
