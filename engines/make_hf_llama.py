"""Write a tiny random Hugging Face `LlamaForCausalLM` with its own byte-level BPE tokenizer, for vLLM.

Why: vLLM needs a model directory and nothing can be downloaded here. The tokenizer is trained offline
with `tokenizers` on a small built-in corpus and carries a ChatML chat template, so `/v1/chat/completions`
works. The weights use the same construction as make_gguf.py: residual channel 0 is held constant and
every special token, and every token that is not printable ASCII, has a large negative output weight on
it, so the model never ends early and every token decodes to whole characters (lengths are exactly
`max_tokens` even without `ignore_eos`).

Run with the vLLM venv's python (it has torch, transformers and tokenizers). Cached by parameters;
prints the model directory.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import random
import shutil
import sys
from dataclasses import astuple, dataclass
from pathlib import Path

from model_text import CHATML_TEMPLATE, FORBIDDEN_LOGIT_WEIGHT, WORDS  # beside this script

FORMAT_VERSION = 2  # 2: max_position_embeddings 4096 -> 16384
VOCAB = 512


@dataclass(frozen=True, slots=True)
class Shape:
    hidden: int
    heads: int  # hidden / heads = 64: a head size every vLLM CPU attention backend supports
    layers: int
    ffn: int


# `tiny` decodes so fast on a CPU that vLLM's API server, not the model, sets the pace: it then
# coalesces many tokens into one chunk and a stream can arrive all at once. `small` (25M parameters)
# takes long enough per step that tokens stream as they are made, like a real model on a GPU.
PRESETS = {"tiny": Shape(hidden=128, heads=2, layers=2, ffn=256),
           "small": Shape(hidden=512, heads=8, layers=8, ffn=1408)}
MAX_POSITIONS = 16384  # the real tests run vLLM with --max-model-len 16384
SPECIALS = ["<s>", "</s>", "<unk>", "<|im_start|>", "<|im_end|>"]


def corpus(seed: int) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 24))) + rng.choice(".,!?")
            for _ in range(4000)]


def build(path: Path, shape: Shape, seed: int) -> None:
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(corpus(seed), trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>",
                                   unk_token="<unk>", pad_token="</s>")
    fast.chat_template = CHATML_TEMPLATE
    n_vocab = len(fast)

    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=n_vocab, hidden_size=shape.hidden, intermediate_size=shape.ffn,
                      num_hidden_layers=shape.layers, num_attention_heads=shape.heads, num_key_value_heads=shape.heads, max_position_embeddings=MAX_POSITIONS,
                      bos_token_id=fast.bos_token_id, eos_token_id=fast.eos_token_id, tie_word_embeddings=False,
                      torch_dtype="float32")
    model = LlamaForCausalLM(cfg)
    allowed = torch.zeros(n_vocab, dtype=torch.bool)
    for i in range(n_vocab):
        text = fast.decode([i])
        allowed[i] = bool(text) and all(0x20 <= ord(ch) <= 0x7E for ch in text) and i not in fast.all_special_ids
    with torch.no_grad():
        emb = model.model.embed_tokens.weight
        emb.normal_(0.0, 0.5)
        emb[:, 0] = 1.0  # the constant channel
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight[0, :] = 0.0  # nothing writes into it
            layer.mlp.down_proj.weight[0, :] = 0.0
        head = model.lm_head.weight
        head.normal_(0.0, 0.5)
        head[:, 0] = 0.0
        head[~allowed, :] = 0.0
        head[~allowed, 0] = FORBIDDEN_LOGIT_WEIGHT
    model.save_pretrained(path, safe_serialization=True)
    fast.save_pretrained(path)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cache", type=Path,
                    default=Path(os.environ.get("TAILGUARD_CACHE", Path.home() / ".cache" / "tailguard")) / "models")
    ap.add_argument("--preset", choices=sorted(PRESETS), default="small")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    shape = PRESETS[args.preset]
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # everything is made here; never reach for a hub
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    key = hashlib.sha256(repr((FORMAT_VERSION, astuple(shape), VOCAB, args.seed)).encode()).hexdigest()[:12]
    path = args.cache / f"hf-llama-{shape.hidden}x{shape.layers}-{key}"
    if not (path / "config.json").exists():
        args.cache.mkdir(parents=True, exist_ok=True)
        tmp = args.cache / f".{path.name}.tmp{os.getpid()}"
        try:
            build(tmp, shape, args.seed)
            shutil.rmtree(path, ignore_errors=True)
            tmp.rename(path)  # a half-written directory never looks cached
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
