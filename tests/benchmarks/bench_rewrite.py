"""What a filter's rewrite of a long chat body costs: llamaswap's (the top level only,
the other values as the client wrote them) beside a whole document (``json.loads`` then
``json.dumps``, what llamaswap did before), in one run.

    python tests/benchmarks/bench_rewrite.py

Each body is a chat request of repeated prose, 200 KB and 2 MB, rewritten as
``useModelName`` rewrites it (``model`` replaced). Best of five rounds.
"""

from __future__ import annotations

import json
import sys
import timeit
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from llamaswap.proxy.extract import ModelIn, Payload, rewrite_body

PROSE = "The quick brown fox jumps over the lazy dog. " * 40
ROUNDS = 20


def chat_body(size: int) -> bytes:
    messages: list[dict[str, str]] = []
    while len(json.dumps(messages)) < size:
        messages.append({"role": "user", "content": PROSE})
    return json.dumps({"model": "chat", "messages": messages, "temperature": 0.5}).encode()


def best_ms(function: Callable[[], object]) -> float:
    return min(timeit.repeat(function, number=ROUNDS, repeat=5)) / ROUNDS * 1e3


def main() -> None:
    print(f"{'body':>10}  {'top level':>10}  {'document':>10}  ratio")
    for size in (200_000, 2_000_000):
        body = chat_body(size)

        def top_level(body: bytes = body) -> None:
            rewrite_body(ModelIn.JSON, Payload(body, "application/json"), model="qwen")

        def document(body: bytes = body) -> None:
            whole = json.loads(body)
            whole["model"] = "qwen"
            json.dumps(whole, separators=(",", ":")).encode()

        ours, whole = best_ms(top_level), best_ms(document)
        print(f"{len(body):>10}  {ours:>7.2f} ms  {whole:>7.2f} ms  {whole / ours:.1f}x")


if __name__ == "__main__":
    main()
