"""The fake server's continuation: an answer resumed from its first k tokens (a chat's
prefill, a completion prompt with the text appended) goes on exactly where it stopped."""

from __future__ import annotations

import json
from typing import Any

import pytest

from llamaswap.fake_server._content import (
    BadRequest,
    Completion,
    answer,
    chat_continuation,
    completion_continuation,
    n_predict,
    seed,
)

MODEL = "chat"
LENGTH = 12
#: 0 (a resume before the first token), 1, the middle, all but one and all of them.
SPLITS = [0, 1, LENGTH // 2, LENGTH - 1, LENGTH]


def job(kind: str, seed_text: str, start: int, tokens: int) -> Completion:
    return Completion(
        kind=kind, id="x", model=MODEL, created=0, prompt_tokens=0, seed=seed_text,
        tokens=tokens, finish_reason="length", stream=False, include_usage=False, start=start,
    )  # fmt: skip


def text_of(completion: Completion) -> str:
    choice = completion.response()["choices"][0]
    text = choice["message"]["content"] if completion.kind == "chat" else choice["text"]
    assert isinstance(text, str)
    return text


def test_an_answer_is_a_prefix_of_any_longer_one() -> None:
    key = seed(MODEL, "hello")
    whole = list(answer(key, LENGTH))
    assert [list(answer(key, k)) for k in range(LENGTH)] == [whole[:k] for k in range(LENGTH)]
    assert list(answer(key, 3, start=4)) == whole[4:7]
    assert whole[0] == whole[0].strip()  # the first token is a bare word
    assert all(token.startswith(" ") and token.count(" ") == 1 for token in whole[1:])


@pytest.mark.parametrize("k", SPLITS)
def test_a_chat_prefill_of_k_tokens_continues_the_answer(k: int) -> None:
    question = "tell me a story"
    whole = "".join(answer(seed(MODEL, question), LENGTH))
    prefill = "".join(answer(seed(MODEL, question), k))
    key, start = chat_continuation(MODEL, question, prefill)
    assert (key, start) == (seed(MODEL, question), k)
    continued = job("chat", key, start, LENGTH - k)
    assert prefill + text_of(continued) == whole
    assert prefill + "".join(continued.pieces()) == whole  # the streamed tokens too
    assert continued.response()["usage"]["completion_tokens"] == LENGTH - k


@pytest.mark.parametrize("k", SPLITS)
@pytest.mark.parametrize("prompt", ["once upon a time", "", "a river ", "say amber"])
def test_a_completion_prompt_ending_in_k_tokens_continues_the_answer(k: int, prompt: str) -> None:
    whole = "".join(answer(seed(MODEL, prompt), LENGTH))
    generated = "".join(answer(seed(MODEL, prompt), k))
    key, start = completion_continuation(MODEL, prompt + generated)
    assert (key, start) == (seed(MODEL, prompt), k)
    continued = job("text", key, start, LENGTH - k)
    assert generated + text_of(continued) == whole
    assert generated + "".join(continued.pieces()) == whole


def test_a_resumed_completion_can_be_resumed_again() -> None:
    prompt = "once upon a time"
    tokens = list(answer(seed(MODEL, prompt), LENGTH))
    first = "".join(tokens[:3])
    key, start = completion_continuation(MODEL, prompt + first)
    then = "".join(answer(key, 4, start))
    assert then == "".join(tokens[3:7])
    key, start = completion_continuation(MODEL, prompt + first + then)
    assert (key, start) == (seed(MODEL, prompt), 7)


def test_an_ordinary_prompt_gets_the_answer_it_always_got() -> None:
    # The words the fake server said before continuation existed, pinned.
    assert "".join(answer(seed("m1", "one two three"), 5)) == "delta orchid willow glacier fjord"
    prompt = "once upon a time"
    assert completion_continuation("fake", prompt) == (seed("fake", prompt), 0)
    assert "".join(answer(seed("fake", prompt), 3)) == "fjord ochre harbor"
    assert chat_continuation(MODEL, "hi", "") == (seed(MODEL, "hi"), 0)


def test_a_prefill_that_is_not_the_answer_continues_from_itself() -> None:
    question = "tell me a story"
    whole = list(answer(seed(MODEL, question), LENGTH))
    for prefill in ["I think", whole[0][:-1], "".join(whole[:2]) + " ", whole[1]]:
        key, start = chat_continuation(MODEL, question, prefill)
        assert (key, start) == (f"{seed(MODEL, question)}\0{prefill}", 1)
        continued = list(answer(key, 5, start))
        assert all(token.startswith(" ") for token in continued)
        assert continued != whole[:5]
    # Another prefill, another continuation; the same one, the same continuation.
    assert chat_continuation(MODEL, question, "I think") != chat_continuation(
        MODEL, question, "I know"
    )


def test_a_completion_prompt_whose_tail_is_not_the_answer_is_a_plain_prompt() -> None:
    prompt = "once upon a time"
    tokens = list(answer(seed(MODEL, prompt), LENGTH))
    wrong = prompt + tokens[0] + tokens[2]  # a word skipped
    assert completion_continuation(MODEL, wrong) == (seed(MODEL, wrong), 0)


def test_the_search_is_linear_in_the_prompt() -> None:
    # 20,000 generated tokens, and a prompt of 6,400 vocabulary words that matches nothing.
    prompt = "once upon a time"
    long = "".join(answer(seed(MODEL, prompt), 20_000))
    assert completion_continuation(MODEL, prompt + long) == (seed(MODEL, prompt), 20_000)
    words = " ".join(["amber", "basalt", "cedar", "delta"] * 1600)
    assert completion_continuation(MODEL, words)[1] <= 6400


def test_llama_cpp_native_completion_bodies() -> None:
    prompt = "once upon a time"
    tokens = list(answer(seed(MODEL, prompt), 5))
    native = job("native", seed(MODEL, prompt), 0, 5)
    native.prompt_tokens = 4
    document = native.response()
    assert document == {
        "index": 0, "content": "".join(tokens), "id_slot": 0, "stop": True, "model": MODEL,
        "tokens_predicted": 5, "tokens_evaluated": 4,
        "stop_type": "limit", "stopping_word": "", "truncated": False,
    }  # fmt: skip
    assert document["content"] == text_of(job("text", seed(MODEL, prompt), 0, 5))
    event = native.chunk(1, tokens[1])
    assert event.startswith(b"data: ")
    assert event.endswith(b"\n\n")
    assert json.loads(event[len(b"data: ") :]) == {
        "index": 0, "content": tokens[1], "id_slot": 0, "stop": False, "model": MODEL,
        "tokens_predicted": 2, "tokens_evaluated": 4,
    }  # fmt: skip
    assert native.head() == b""
    tail = native.tail({"predicted_n": 5})
    assert b"[DONE]" not in tail
    assert tail.count(b"data: ") == 1
    final = json.loads(tail[len(b"data: ") :])
    assert final == {**document, "content": "", "timings": {"predicted_n": 5}}
    native.finish_reason = "stop"  # no n_predict: the fake's own length, its end of text
    assert native.response()["stop_type"] == "eos"


@pytest.mark.parametrize(
    ("body", "expected"),
    [({}, (16, False)), ({"n_predict": -1}, (16, False)), ({"n_predict": 0}, (0, True)),
     ({"n_predict": 7, "max_tokens": 3}, (7, True))],
)  # fmt: skip
def test_n_predict_is_the_native_length(body: dict[str, Any], expected: tuple[int, bool]) -> None:
    assert n_predict(body, 16) == expected


@pytest.mark.parametrize("value", ["5", 2.5, True])
def test_a_bad_n_predict_is_a_bad_request(value: object) -> None:
    with pytest.raises(BadRequest, match="n_predict must be an integer"):
        n_predict({"n_predict": value}, 16)
