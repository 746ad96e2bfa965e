"""Write a small llama GGUF with random weights, deterministically from a seed.

``python -m canarystack.engine.gguf_gen --out model.gguf --seed 0`` writes a 4-layer
llama (vocab 512, embedding 256, 4 heads / 2 KV heads, FFN 768, context 8192, F32:
3.4M parameters, 13 MB) in about a second. No weights are shipped or downloaded.

Must never touch the network, and must stay deterministic: the same seed and shape give
the same bytes (no timestamps, no dict-order or thread-count dependence).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from canary_contract.bounds import bounded, check_bounds

# Same pseudo-word syllables as gameday.load.prompts / canarystack.tokenizer.
_ONSETS = ("", "b", "d", "f", "g", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z", "sh")
_VOWELS = ("a", "e", "i", "o", "u", "ai", "ou", "ea")
WORD_START = "\u2581"  # SentencePiece's "▁"

# gguf.TokenType values (kept here so this module documents what it writes).
TOKEN_NORMAL = 1
TOKEN_UNKNOWN = 2
TOKEN_CONTROL = 3
TOKEN_BYTE = 6

N_SPECIAL = 3  # <unk>, <s>, </s>
N_BYTES = 256


@dataclass(frozen=True)
class ModelShape:
    """The model's size and the standard deviations of its random weights.

    Scales. The default random init of a transformer (std 0.02) gives near-uniform next-token
    distributions, in which a numerical fault barely shows. "Medium" scales (weights std
    0.03, q/k 0.1, output 0.25, embeddings 0.5; ../shared/MEASURED.md) give an entropy of
    about 2-3 nats and a top-1 probability of 0.3-0.6: peaked enough that a quantized KV
    cache moves the distributions measurably, flat enough that top-5 lists carry mass.
    """

    vocab: int = bounded(512, ge=N_SPECIAL + N_BYTES + 1)  # the specials, the bytes, a piece
    embedding: int = 256
    layers: int = 4
    heads: int = 4
    kv_heads: int = 2
    ffn: int = 768
    context: int = 8192
    rms_eps: float = 1e-5
    rope_base: float = 10000.0
    std_weights: float = 0.03
    std_qk: float = 0.1
    std_output: float = 0.25
    std_embeddings: float = 0.5

    def check(self) -> None:
        check_bounds(self)
        if self.embedding % self.heads or self.heads % self.kv_heads:
            raise ValueError(
                f"embedding {self.embedding}, heads {self.heads}, kv_heads {self.kv_heads}: "
                "the embedding must split evenly into heads, and heads into KV groups"
            )
        if (self.embedding // self.heads) % 32:
            # A q8_0/q4_0 KV cache quantizes in blocks of 32 along the head dimension.
            raise ValueError(
                f"head size {self.embedding // self.heads}: must be a multiple of 32 so the "
                "KV cache can be quantized (q8_0, q4_0)"
            )

    @property
    def head_dim(self) -> int:
        return self.embedding // self.heads


def vocabulary(size: int) -> tuple[list[str], list[int], list[float]]:
    """Token texts, types and scores: specials, 256 bytes, then multi-character pieces.

    Tokenizer: llama's SentencePiece model (``tokenizer.ggml.model = "llama"``) with byte
    fallback — ``<unk>``, ``<s>``, ``</s>``, the 256 byte tokens ``<0x00>``..``<0xFF>``, then
    multi-character pieces (the syllables of the load generator's pseudo-words, with and
    without the word-start marker ``▁``). Token types are set (else llama.cpp prints byte
    tokens as ``<0xC3>``). Two choices keep OpenAI-style ``top_logprobs`` — a dict keyed by
    token *text* — lossless for the tokens that matter:

    - no piece is a single ASCII character, so no piece shares its text with an ASCII byte
      token (but ``▁``, see below);
    - the output rows of the control tokens and of the bytes 0x80-0xFF (which alone are not
      valid UTF-8 and all print as ``""``) are zero: their logit is 0 while the listed
      tokens' logits sit several standard deviations above, so they never reach a top-5.
      The ASCII control bytes (0x00-0x1F, 0x7F) are silenced the same way, so generated
      text stays printable, and so is the space byte 0x20, which prints like the piece
      ``▁`` (a space comes from that piece).
    """
    tokens = ["<unk>", "<s>", "</s>"]
    types = [TOKEN_UNKNOWN, TOKEN_CONTROL, TOKEN_CONTROL]
    tokens += [f"<0x{b:02X}>" for b in range(N_BYTES)]
    types += [TOKEN_BYTE] * N_BYTES
    syllables = [o + v for o in _ONSETS for v in _VOWELS]
    # Pieces the SentencePiece merges can reach from characters: every multi-letter
    # syllable, then the word-start forms, then two-syllable words (only multi-char).
    # "▁" alone (a space between non-piece characters): without it a lone space falls
    # back to its three UTF-8 bytes and prints as "▁".
    pieces: list[str] = [WORD_START, "sh"]
    pieces += [s for s in syllables if len(s) > 1 and s not in pieces]
    pieces += [WORD_START + s for s in syllables]
    pieces += [a + b for a in syllables[8:40] for b in syllables[:8]]
    seen: set[str] = set()
    unique = [p for p in pieces if not (p in seen or seen.add(p))]  # type: ignore[func-returns-value]
    room = size - len(tokens)
    if len(unique) < room:
        raise ValueError(f"vocab {size}: only {len(tokens) + len(unique)} tokens can be made")
    chosen = unique[:room]
    tokens += chosen
    types += [TOKEN_NORMAL] * len(chosen)
    # SentencePiece merges the highest-scoring pair first: prefer longer pieces.
    scores = [0.0] * (N_SPECIAL + N_BYTES) + [
        float(len(p)) - i * 1e-4 for i, p in enumerate(chosen)
    ]
    return tokens, types, scores


def silent_token_ids(types: Sequence[int]) -> list[int]:
    """Tokens whose output row is zero: control/unknown, ASCII control and space, and
    non-ASCII bytes."""
    silent = [i for i, t in enumerate(types) if t in (TOKEN_UNKNOWN, TOKEN_CONTROL)]
    silent += [N_SPECIAL + b for b in (*range(0x21), 0x7F, *range(0x80, 0x100))]
    return silent


def _tensors(shape: ModelShape, seed: int, types: Sequence[int]) -> list[tuple[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    e, kv = shape.embedding, shape.kv_heads * shape.head_dim

    def normal(rows: int, cols: int, std: float) -> np.ndarray:
        # numpy shape (rows, cols) is ggml's ne = [cols, rows]: (out, in) for a matmul.
        return (rng.standard_normal((rows, cols), dtype=np.float32) * np.float32(std)).astype(
            np.float32
        )

    ones = np.ones(e, dtype=np.float32)
    out: list[tuple[str, np.ndarray]] = [
        ("token_embd.weight", normal(shape.vocab, e, shape.std_embeddings))
    ]
    for i in range(shape.layers):
        out += [
            (f"blk.{i}.attn_norm.weight", ones.copy()),
            (f"blk.{i}.attn_q.weight", normal(e, e, shape.std_qk)),
            (f"blk.{i}.attn_k.weight", normal(kv, e, shape.std_qk)),
            (f"blk.{i}.attn_v.weight", normal(kv, e, shape.std_weights)),
            (f"blk.{i}.attn_output.weight", normal(e, e, shape.std_weights)),
            (f"blk.{i}.ffn_norm.weight", ones.copy()),
            (f"blk.{i}.ffn_gate.weight", normal(shape.ffn, e, shape.std_weights)),
            (f"blk.{i}.ffn_up.weight", normal(shape.ffn, e, shape.std_weights)),
            (f"blk.{i}.ffn_down.weight", normal(e, shape.ffn, shape.std_weights)),
        ]
    output = normal(shape.vocab, e, shape.std_output)
    output[silent_token_ids(types)] = 0.0
    out += [("output_norm.weight", ones.copy()), ("output.weight", output)]
    return out


def write_gguf(path: str | Path, seed: int = 0, shape: ModelShape | None = None) -> Path:
    """Write the model to ``path`` (atomically: a temporary file, then a rename)."""
    import gguf  # the optional 'engine' extra; imported here so the package imports without it

    shape = shape or ModelShape()
    shape.check()
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    # Own temp name per process: pods that generate the same model at once each write
    # identical bytes and rename atomically; a reader never sees a partial file.
    tmp = target.with_name(f"{target.name}.{os.getpid()}.tmp")
    tokens, types, scores = vocabulary(shape.vocab)
    writer = gguf.GGUFWriter(str(tmp), "llama")
    writer.add_name(f"canarystack-random-llama-seed{seed}")
    writer.add_context_length(shape.context)
    writer.add_embedding_length(shape.embedding)
    writer.add_block_count(shape.layers)
    writer.add_feed_forward_length(shape.ffn)
    writer.add_head_count(shape.heads)
    writer.add_head_count_kv(shape.kv_heads)
    writer.add_rope_dimension_count(shape.head_dim)
    writer.add_rope_freq_base(shape.rope_base)
    writer.add_layer_norm_rms_eps(shape.rms_eps)
    writer.add_vocab_size(shape.vocab)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_scores(scores)
    writer.add_unk_token_id(0)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_add_bos_token(True)
    writer.add_add_eos_token(False)
    for name, array in _tensors(shape, seed, types):
        writer.add_tensor(name, array)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    tmp.replace(target)
    return target


def sha256_file(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m canarystack.engine.gguf_gen",
        description="Write a small llama GGUF with random 'medium'-scale weights and a "
        "byte-level tokenizer, deterministically from a seed.",
    )
    p.add_argument("--out", required=True, help="where to write the .gguf file")
    p.add_argument("--seed", type=int, default=0, help="weights seed (default %(default)s)")
    p.add_argument("--layers", type=int, default=ModelShape.layers, help="(default %(default)s)")
    p.add_argument(
        "--embedding", type=int, default=ModelShape.embedding, help="(default %(default)s)"
    )
    args = p.parse_args(argv)
    if args.seed < 0:
        p.error(f"--seed {args.seed}: give an integer >= 0")
    if args.layers < 1:
        p.error(f"--layers {args.layers}: give at least 1")
    try:
        import gguf  # noqa: F401
    except ImportError:
        print(
            "python -m canarystack.engine.gguf_gen: the 'gguf' package is missing; install "
            "the engine extra: pip install '.[engine]' (or make test-engine)",
            file=sys.stderr,
        )
        return 2
    shape = ModelShape(layers=args.layers, embedding=args.embedding)
    try:
        shape.check()
    except ValueError as exc:
        p.error(str(exc))
    t0 = time.perf_counter()
    path = write_gguf(args.out, args.seed, shape)
    print(
        f"wrote {path} ({path.stat().st_size / 1e6:.1f} MB, seed {args.seed}) in "
        f"{time.perf_counter() - t0:.2f}s, sha256 {sha256_file(path)}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
