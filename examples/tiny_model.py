"""Write a tiny llama-architecture GGUF model with random weights.

    python examples/tiny_model.py examples/models/tiny-a.gguf examples/models/tiny-b.gguf

No model can be downloaded everywhere llamaswap is tested, so this makes one: a single
transformer block, embeddings of width 32, and a SentencePiece-style vocabulary of 313
tokens (the three special tokens, the 256 byte tokens, a few dozen pieces). Each file is
about 120 KB and llama.cpp loads it like any other: what it serves is gibberish, but it is
served by the real inference code, at a real (if tiny) cost per token.

The file has no chat template: serve it with llama-cpp-python's ``--chat_format chatml``.
Each further file gets the next seed, hence different weights and different gibberish, so
two files make two models to swap between.

Needs the ``gguf`` and ``numpy`` packages (``pip install 'llamaswap[llamacpp]'``).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import gguf
import numpy as np

CONTEXT_LENGTH = 8192  # long enough for thousands of generated tokens in one reply
EMBEDDING = 32
FEED_FORWARD = 64
HEADS = 4
KV_HEADS = 2  # grouped-query attention, as in most current llama-family models
HEAD_DIM = EMBEDDING // HEADS

SPECIALS = [("<unk>", gguf.TokenType.UNKNOWN), ("<s>", gguf.TokenType.CONTROL)]
SPECIALS += [("</s>", gguf.TokenType.CONTROL)]
UNK, BOS, EOS = 0, 1, 2
SPACE = "\u2581"  # SentencePiece's word-start marker
WORDS = "the a and of to in is it hello world"

# Random weights would pick byte tokens as often as anything, and random bytes are mostly
# invalid UTF-8, which llama-cpp-python withholds from a stream until it decodes (at a
# cost that grows with every token held). So the model is steered towards its ordinary
# pieces: dimension 0 of the residual stream is a constant that no layer writes to, a
# bias feature, and the output matrix turns it into a large penalty for every other token
# and a bonus for the end of text, so that replies end after a few dozen tokens.
BIAS = 8.0
FORBIDDEN = -10.0
END_OF_TEXT = 0.4
OUTPUT_SCALE = 0.5  # the spread of the logits: how varied the gibberish is


def vocabulary() -> tuple[list[str], list[float], list[int]]:
    """Tokens, their merge scores and their types, in id order."""
    tokens = [text for text, _ in SPECIALS]
    types = [int(kind) for _, kind in SPECIALS]
    # The byte tokens let the tokenizer spell anything the pieces below cannot.
    tokens += [f"<0x{byte:02X}>" for byte in range(256)]
    types += [int(gguf.TokenType.BYTE)] * 256
    pieces = [SPACE, *"abcdefghijklmnopqrstuvwxyz", *".,!?"]
    # SentencePiece builds a word by merging adjacent pieces, so every prefix must exist.
    for word in WORDS.split():
        pieces += [SPACE + word[:end] for end in range(1, len(word) + 1)]
    pieces = list(dict.fromkeys(pieces))
    tokens += pieces
    types += [int(gguf.TokenType.NORMAL)] * len(pieces)
    # The highest-scoring merge goes first: prefer longer pieces.
    scores = [0.0] * (len(SPECIALS) + 256) + [float(len(piece)) for piece in pieces]
    return tokens, scores, types


Array = np.ndarray[tuple[int, ...], np.dtype[np.float32]]


def tensors(seed: int, types: list[int]) -> dict[str, Array]:
    """Random weights, shaped as llama.cpp expects (numpy order: rows = output features)."""
    rng = np.random.default_rng(seed)

    def weight(rows: int, columns: int, scale: float | None = None) -> Array:
        # Scaled by fan-in, so activations keep about unit size through the block.
        spread = columns**-0.5 if scale is None else scale
        return (rng.standard_normal((rows, columns)) * spread).astype(np.float32)

    def norm() -> Array:
        return np.ones(EMBEDDING, dtype=np.float32)

    embeddings = weight(len(types), EMBEDDING, scale=1.0)
    embeddings[:, 0] = BIAS
    attention_out, ffn_down = weight(EMBEDDING, EMBEDDING), weight(EMBEDDING, FEED_FORWARD)
    attention_out[0, :] = ffn_down[0, :] = 0.0  # nothing writes to the bias feature
    output = weight(len(types), EMBEDDING, scale=OUTPUT_SCALE)
    output[:, 0] = [0.0 if kind == gguf.TokenType.NORMAL else FORBIDDEN for kind in types]
    output[EOS] = 0.0  # the same odds of ending after every token, whatever the seed
    output[EOS, 0] = END_OF_TEXT
    kv_width = KV_HEADS * HEAD_DIM
    return {
        "token_embd.weight": embeddings,
        "blk.0.attn_norm.weight": norm(),
        "blk.0.attn_q.weight": weight(EMBEDDING, EMBEDDING),
        "blk.0.attn_k.weight": weight(kv_width, EMBEDDING),
        "blk.0.attn_v.weight": weight(kv_width, EMBEDDING),
        "blk.0.attn_output.weight": attention_out,
        "blk.0.ffn_norm.weight": norm(),
        "blk.0.ffn_gate.weight": weight(FEED_FORWARD, EMBEDDING),
        "blk.0.ffn_up.weight": weight(FEED_FORWARD, EMBEDDING),
        "blk.0.ffn_down.weight": ffn_down,
        "output_norm.weight": norm(),
        "output.weight": output,
    }


def write(path: Path, *, seed: int) -> None:
    """Write the model to ``path`` (its folder is created if missing)."""
    tokens, scores, types = vocabulary()
    path.parent.mkdir(parents=True, exist_ok=True)
    writer = gguf.GGUFWriter(path, "llama")
    writer.add_name(f"tiny random llama (seed {seed})")
    writer.add_file_type(int(gguf.LlamaFileType.ALL_F32))
    writer.add_context_length(CONTEXT_LENGTH)
    writer.add_embedding_length(EMBEDDING)
    writer.add_block_count(1)
    writer.add_feed_forward_length(FEED_FORWARD)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(KV_HEADS)
    writer.add_rope_dimension_count(HEAD_DIM)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(len(tokens))
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores(scores)
    writer.add_token_types(types)
    writer.add_unk_token_id(UNK)
    writer.add_bos_token_id(BOS)
    writer.add_eos_token_id(EOS)
    for name, array in tensors(seed, types).items():
        writer.add_tensor(name, array)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Write tiny random llama GGUF models.")
    parser.add_argument("out", type=Path, nargs="+", help="the .gguf file(s) to write")
    parser.add_argument(
        "--seed", type=int, default=1, help="seed of the first file; the next ones count up"
    )
    args = parser.parse_args(argv)
    for offset, path in enumerate(args.out):
        write(path, seed=args.seed + offset)
        print(f"wrote {path} ({path.stat().st_size} bytes, seed {args.seed + offset})")


if __name__ == "__main__":
    main()
