"""Write the small model the vLLM engine pods serve: no download, the same bytes from the
same seed (run with the vLLM venv's Python, which has transformers and tokenizers).

    python canarystack/engine/vllm_model.py --out DIR [--seed 0]

A 4-layer Llama (hidden 256, 4 heads, ~2.6 M parameters, random weights from ``--seed``,
float32 safetensors) and a byte-level BPE tokenizer of 2,048 tokens trained on text made
here from the seed (pseudo-words like the load generator's prompts), with a chat template
the engine pod counts the same way (``canarystack.engine.vllm.VllmPromptCounter``). Writes
``DIR/.complete`` last: a folder without it is half-written and is rebuilt.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
from pathlib import Path

VOCAB = 2048
MAX_LEN = 2048
# The chat template: one line per message, then the assistant's turn. The engine pod
# renders the same text to count a chat's prompt tokens (canarystack.engine.vllm.VllmPromptCounter).
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}\n"
    "{% endfor %}{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
SPECIAL = ["<s>", "</s>", "<unk>", "<|system|>", "<|user|>", "<|assistant|>"]


def corpus(seed: int, lines: int = 4000) -> list[str]:
    """Pseudo-word text from ``seed``: syllables like the load generator's prompts."""
    rng = random.Random(seed)
    syllables = [a + b for a in "bcdfghjklmnprstvwz" for b in "aeiou"]
    words = ["".join(rng.choice(syllables) for _ in range(rng.randint(1, 4))) for _ in range(3000)]
    out = []
    for _ in range(lines):
        out.append(" ".join(rng.choice(words) for _ in range(rng.randint(4, 20))) + ".")
    return out


def write_tokenizer(out: Path, seed: int) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB,
        special_tokens=SPECIAL,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(corpus(seed), trainer=trainer)
    bos = tok.token_to_id("<s>")
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", bos)]
    )
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        model_max_length=MAX_LEN,
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(str(out))


def write_model(out: Path, seed: int) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=256,
        intermediate_size=688,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=MAX_LEN,
        bos_token_id=0,
        eos_token_id=1,
        torch_dtype="float32",
        tie_word_embeddings=False,
    )
    model = LlamaForCausalLM(config)
    # Random weights with a spread that gives peaked, varied next-token distributions.
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0.0, 0.08)
    model.save_pretrained(str(out), safe_serialization=True)


def main() -> int:
    p = argparse.ArgumentParser(prog="vllm_model.py")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    out: Path = args.out
    if (out / ".complete").exists():
        print(f"vllm_model: {out} is already complete")
        return 0
    # Written beside it and renamed into place: pods started together may all write it,
    # and a reader never sees half a model.
    tmp = out.parent / f".{out.name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    write_tokenizer(tmp, args.seed)
    write_model(tmp, args.seed)
    (tmp / ".complete").write_text(json.dumps({"seed": args.seed, "vocab": VOCAB}))
    if out.exists() and not (out / ".complete").exists():
        shutil.rmtree(out, ignore_errors=True)  # a half-written folder of an older writer
    try:
        os.rename(tmp, out)
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)  # another writer got there first
        if not (out / ".complete").exists():
            raise
    print(f"vllm_model: wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
