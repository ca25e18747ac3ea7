"""The text side of the `transformers` runtime's decode loop, without a model: where a stop
string cuts, what a stream holds back, and incremental detokenization over characters that
span several tokens."""

from __future__ import annotations

from sluice.worker.runtimes.transformers import (
    Detokenizer,
    fallback_chat_prompt,
    find_stop,
    held_back,
)


def byte_decode(ids: list[int]) -> str:
    """A byte-level tokenizer's decode: each token one byte, invalid UTF-8 as U+FFFD."""
    return bytes(ids).decode("utf-8", errors="replace")


def test_find_stop_takes_the_earliest_stop_and_only_new_matches() -> None:
    assert find_stop("abc END def STOP", ("STOP", "END"), 0) == 4
    assert find_stop("abc", ("x",), 0) is None
    # Text before `start` was searched already; a match may still straddle it.
    assert find_stop("xxENxD", ("END",), 4) is None
    assert find_stop("xxEND", ("END",), 4) == 2


def test_held_back_is_the_longest_tail_that_could_become_a_stop() -> None:
    assert held_back("hello wor", ("world",)) == 3
    assert held_back("hello w", ("world", "xyz")) == 1
    assert held_back("hello", ("world",)) == 0
    assert held_back("aab", ("abc", "aabx")) == 3
    assert held_back("anything", ()) == 0


def test_detokenizer_gives_each_character_once_it_is_complete() -> None:
    text = "añb€c"  # ñ is 2 bytes, € is 3
    detok = Detokenizer(byte_decode)
    pieces = [detok.add(b) for b in text.encode()]
    assert "".join(pieces) == text
    assert pieces == ["a", "", "ñ", "b", "", "", "€", "c"]
    assert detok.rest() == ""


def test_detokenizer_rest_gives_an_unfinished_character_as_it_decodes() -> None:
    detok = Detokenizer(byte_decode)
    assert detok.add(ord("a")) == "a"
    assert detok.add("€".encode()[0]) == ""
    assert detok.rest() == "\ufffd"
    assert detok.ids == [ord("a"), 0xE2]


def test_detokenizer_decodes_a_short_window_not_the_whole_text() -> None:
    lengths: list[int] = []

    def decode(ids: list[int]) -> str:
        lengths.append(len(ids))
        return byte_decode(ids)

    detok = Detokenizer(decode)
    for b in ("x" * 500).encode():
        detok.add(b)
    assert max(lengths) <= 2


def test_fallback_chat_prompt() -> None:
    assert fallback_chat_prompt((("user", "hi"),)) == "user: hi\nassistant:"
