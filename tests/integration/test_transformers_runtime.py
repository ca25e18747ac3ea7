"""The `transformers` runtime in-process on the tiny random GPT-2 (tests/tiny_lm.py): sampling
controls, stop strings, usage counts, the context cap, EOS, chat templates, and a caller
that goes away stopping the generation thread."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from contextlib import aclosing
from pathlib import Path
from typing import Any

import pytest

from sluice.spec.models import ModelSpec
from sluice.worker.runtimes import TextRequest, make_runtime
from sluice.worker.runtimes.transformers import (
    ContextLengthExceeded,
    TransformersRuntime,
    fallback_chat_prompt,
)
from tests.tiny_lm import EOS_PROMPT, TinyLM

PROMPT = "hello world"
CHAT = (("system", "be brief"), ("user", "what is the answer?"))


def load(path: Path, **params: Any) -> TransformersRuntime:
    spec = ModelSpec.model_validate(
        {"runtime": "transformers", "transformers": {"model_path": str(path), **params}}
    )
    runtime = make_runtime("tiny", spec, "grp-1")
    assert isinstance(runtime, TransformersRuntime)
    asyncio.run(runtime.load())
    return runtime


@pytest.fixture(scope="module")
def lm(tiny_lm: TinyLM) -> TransformersRuntime:
    return load(tiny_lm.main, max_new_tokens=2000)


@pytest.fixture(scope="module")
def tokenizer(tiny_lm: TinyLM) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tiny_lm.main), local_files_only=True)


def complete(runtime: TransformersRuntime, request: TextRequest) -> Any:
    return asyncio.run(runtime.complete(request))


def stream(runtime: TransformersRuntime, request: TextRequest) -> tuple[list[str], Any]:
    async def collect() -> tuple[list[str], Any]:
        tokens = await runtime.stream(request)
        async with aclosing(tokens.pieces) as pieces:
            return [piece async for piece in pieces], tokens

    return asyncio.run(collect())


def generation_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("generate-")]


def assert_stopped(passes: Callable[[], int], limit: int) -> None:
    """Once the caller is back, its generation has made its last forward pass (the thread
    may take a moment more to exit), well before `limit`."""
    at_return = passes()
    for thread in generation_threads():
        thread.join(timeout=10)
    assert not generation_threads()
    assert passes() == at_return, "a forward pass ran after the caller was told it stopped"
    assert at_return < limit, f"generation went on after the caller left: {at_return} passes"


def test_same_seed_same_text_other_seed_other_text(lm: TransformersRuntime) -> None:
    first = complete(lm, TextRequest(PROMPT, 24, seed=7))
    again = complete(lm, TextRequest(PROMPT, 24, seed=7))
    other = complete(lm, TextRequest(PROMPT, 24, seed=8))
    assert first.text == again.text
    assert first.text != other.text


def test_temperature_0_is_greedy_and_a_tiny_top_p_is_too(lm: TransformersRuntime) -> None:
    greedy = complete(lm, TextRequest(PROMPT, 24, temperature=0.0, seed=1))
    assert complete(lm, TextRequest(PROMPT, 24, temperature=0.0, seed=2)).text == greedy.text
    # top_p keeps the smallest set of tokens reaching p: for p near 0, only the likeliest one.
    nucleus = complete(lm, TextRequest(PROMPT, 24, temperature=1.0, top_p=1e-6, seed=3))
    assert nucleus.text == greedy.text
    assert complete(lm, TextRequest(PROMPT, 24, temperature=1.0, seed=3)).text != greedy.text


def test_usage_counts_prompt_and_generated_tokens(lm: TransformersRuntime, tokenizer: Any) -> None:
    result = complete(lm, TextRequest(PROMPT, 17, seed=1))
    assert result.prompt_tokens == len(tokenizer(PROMPT)["input_ids"])
    # the tiny model has no EOS: it always runs to the limit
    assert (result.completion_tokens, result.finish_reason) == (17, "length")
    rendered = tokenizer.apply_chat_template(
        [{"role": r, "content": c} for r, c in CHAT], add_generation_prompt=True, tokenize=False
    )
    chat = complete(lm, TextRequest("", 5, messages=CHAT, seed=1))
    assert chat.prompt_tokens == len(tokenizer(rendered, add_special_tokens=False)["input_ids"])
    assert chat.completion_tokens == 5


def test_without_a_chat_template_messages_become_role_lines(
    tiny_lm: TinyLM, tokenizer: Any
) -> None:
    plain = load(tiny_lm.plain)
    chat = complete(plain, TextRequest("", 4, messages=CHAT, temperature=0.0))
    expected = "system: be brief\nuser: what is the answer?\nassistant:"
    assert fallback_chat_prompt(CHAT) == expected
    assert chat.prompt_tokens == len(tokenizer(expected)["input_ids"])
    same = complete(plain, TextRequest(expected, 4, temperature=0.0))
    assert chat.text == same.text


def test_a_stream_is_the_completion_in_pieces(lm: TransformersRuntime) -> None:
    request = TextRequest(PROMPT, 40, seed=11)
    pieces, tokens = stream(lm, request)
    whole = complete(lm, request)
    assert "".join(pieces) == whole.text
    assert len(pieces) > 10, "text goes out as it is generated, not at the end"
    assert (tokens.completion_tokens, tokens.finish_reason) == (40, "length")
    assert tokens.prompt_tokens == whole.prompt_tokens


def test_a_stop_string_ends_the_text_before_it(lm: TransformersRuntime) -> None:
    free = complete(lm, TextRequest(PROMPT, 60, temperature=0.0)).text
    stop = free[20:23]
    expected = free[: free.find(stop)]
    cut = complete(lm, TextRequest(PROMPT, 60, temperature=0.0, stop=("never-there", stop)))
    assert (cut.text, cut.finish_reason) == (expected, "stop")
    assert cut.completion_tokens < 60
    pieces, tokens = stream(lm, TextRequest(PROMPT, 60, temperature=0.0, stop=(stop,)))
    assert "".join(pieces) == expected and tokens.finish_reason == "stop"
    assert tokens.completion_tokens == cut.completion_tokens


def test_a_stop_string_that_never_completes_is_sent_at_the_end(lm: TransformersRuntime) -> None:
    free = complete(lm, TextRequest(PROMPT, 30, temperature=0.0)).text
    stop = free[-2:] + "\x00"  # the text ends with the start of this stop string
    pieces, tokens = stream(lm, TextRequest(PROMPT, 30, temperature=0.0, stop=(stop,)))
    assert "".join(pieces) == free and tokens.finish_reason == "length"


def test_max_new_tokens_caps_the_request(tiny_lm: TinyLM) -> None:
    capped = load(tiny_lm.main, max_new_tokens=6)
    assert complete(capped, TextRequest(PROMPT, 100, seed=1)).completion_tokens == 6
    assert complete(capped, TextRequest(PROMPT, None, seed=1)).completion_tokens == 6
    assert complete(capped, TextRequest(PROMPT, 3, seed=1)).completion_tokens == 3


def test_the_context_caps_generation_and_refuses_a_prompt_that_fills_it(
    lm: TransformersRuntime, tokenizer: Any
) -> None:
    assert lm.context == 1024
    long_prompt = "hello " * 505
    n = len(tokenizer(long_prompt)["input_ids"])
    assert 1000 < n < 1024
    result = complete(lm, TextRequest(long_prompt, 500, seed=1))
    assert (result.completion_tokens, result.finish_reason) == (1024 - n, "length")
    too_long = TextRequest("hello " * 600, 5)
    with pytest.raises(ContextLengthExceeded, match="context of 1024 tokens"):
        asyncio.run(lm.admit(too_long))


def test_eos_ends_the_generation_and_counts_as_a_token(tiny_lm: TinyLM) -> None:
    stops = load(tiny_lm.eos)
    result = complete(stops, TextRequest(EOS_PROMPT, 10, temperature=0.0))
    assert (result.finish_reason, result.completion_tokens) == ("stop", tiny_lm.eos_after)
    main = load(tiny_lm.main)
    before = complete(main, TextRequest(EOS_PROMPT, tiny_lm.eos_after - 1, temperature=0.0))
    assert result.text == before.text  # the EOS token itself is not text


def test_concurrent_requests_keep_their_own_seeds(lm: TransformersRuntime) -> None:
    requests = [TextRequest(PROMPT, 30, seed=seed) for seed in range(4)]
    alone = [complete(lm, r).text for r in requests]

    async def together() -> list[str]:
        results = await asyncio.gather(*(lm.complete(r) for r in requests))
        return [r.text for r in results]

    assert asyncio.run(together()) == alone


def count_forward_passes(runtime: TransformersRuntime) -> Callable[[], int]:
    """Wrap the model's forward pass with a counter (the real pass still runs)."""
    forward = runtime._forward
    assert forward is not None
    calls = 0

    def counted(ids: Any, cache: Any) -> Any:
        nonlocal calls
        calls += 1
        return forward(ids, cache)

    runtime._forward = counted
    return lambda: calls


def test_closing_a_stream_stops_its_generation(tiny_lm: TinyLM) -> None:
    runtime = load(tiny_lm.main, max_new_tokens=1000)
    passes = count_forward_passes(runtime)

    async def leave_after_two_pieces() -> None:
        tokens = await runtime.stream(TextRequest(PROMPT, 1000, seed=1))
        async with aclosing(tokens.pieces) as pieces:
            async for _ in pieces:
                if passes() >= 2:
                    break  # closing the stream must stop the thread, and wait for it

    asyncio.run(leave_after_two_pieces())
    assert_stopped(passes, 1000)


def test_cancelling_a_completion_stops_its_generation(tiny_lm: TinyLM) -> None:
    runtime = load(tiny_lm.main, max_new_tokens=1000)
    passes = count_forward_passes(runtime)

    async def cancel_midway() -> None:
        task = asyncio.ensure_future(runtime.complete(TextRequest(PROMPT, 1000, seed=1)))
        while passes() < 2:
            await asyncio.sleep(0.001)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(cancel_midway())
    assert_stopped(passes, 1000)


def test_a_stream_never_read_never_starts_generating(tiny_lm: TinyLM) -> None:
    runtime = load(tiny_lm.main)
    passes = count_forward_passes(runtime)

    async def open_and_close() -> None:
        tokens = await runtime.stream(TextRequest(PROMPT, 100, seed=1))
        await tokens.pieces.aclose()

    asyncio.run(open_and_close())
    assert passes() == 0
