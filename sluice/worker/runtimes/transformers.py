"""`transformers`: a causal language model from a local Hugging Face directory, generated
token by token in a thread, on the CPU or the instance's GPU.

A decode loop of our own rather than `model.generate`, because it gives each request what
generate cannot: its own seeded `torch.Generator` (generate samples from torch's global one,
so concurrent requests would disturb each other's seed), a cancel flag read before every
forward pass (a client that leaves stops the work within one token), stop strings cut
exactly and held back from a stream until they can no longer be the start of one, and the
exact number of tokens sampled for `usage`.

Each generation runs in a thread of its own, and the worker's slots (`max_concurrency`) bound
how many run at once: rather than one lock serialising them, so that a request arriving
behind a long one starts at once instead of waiting for all of it. Measured on 2 shared
vCPUs, 4 requests of 100 tokens: aggregate tokens/s side by side vs one after another is
equal within the noise (tiny model 943 vs 1158 then 774 vs 622; a 19M-parameter GPT-2 104
vs 105 then 123 vs 97): torch releases the GIL inside its kernels, so with free cores
concurrent requests can use them (`cpu_threads` torch threads each), and there is no
batching across requests (that is a serving engine's job: the `command` runtime runs one).
Tokenizer calls are serialised by a lock (a fast tokenizer's Rust state is not shared safely
between threads). torch and transformers are imported in `load`, so sim workers never pay
for them; loading and a warm-up generation run in a thread before the model counts as loaded.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import os
import threading
from collections.abc import AsyncGenerator, Callable
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any

from sluice.core.errors import SluiceError
from sluice.spec.models import ModelSpec, TransformersParams
from sluice.worker.runtimes.base import Completion, Endpoint, Runtime, TextRequest, TokenStream

__all__ = [
    "FALLBACK_CHAT_TEMPLATE",
    "ContextLengthExceeded",
    "Detokenizer",
    "TransformersRuntime",
    "fallback_chat_prompt",
    "find_stop",
    "held_back",
]

log = logging.getLogger("sluice.worker.transformers")

FALLBACK_CHAT_TEMPLATE = "one line `role: text` per message, then `assistant:`"
"""How chat messages become a prompt when the tokenizer has no chat template of its own."""

_CONTEXT_FIELDS = ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length")
_WARMUP_PROMPT = "Hello"
_WARMUP_TOKENS = 2


class ContextLengthExceeded(SluiceError):
    """The prompt leaves no room to generate in the model's context (OpenAI's code)."""

    http_status = 400
    code = "context_length_exceeded"


class TemplateError(SluiceError):
    """The model's chat template refused the messages (e.g. roles it does not allow)."""

    http_status = 400
    code = "invalid_request"


def fallback_chat_prompt(messages: tuple[tuple[str, str], ...]) -> str:
    """The prompt for a tokenizer without a chat template: see FALLBACK_CHAT_TEMPLATE."""
    return "".join(f"{role}: {text}\n" for role, text in messages) + "assistant:"


def find_stop(text: str, stops: tuple[str, ...], start: int) -> int | None:
    """Where the earliest stop string in `text` begins, looking only at matches that end
    after `start` (the text before it was searched already); None if there is none."""
    found: int | None = None
    for stop in stops:
        at = text.find(stop, max(0, start - len(stop) + 1))
        if at != -1 and (found is None or at < found):
            found = at
    return found


def held_back(text: str, stops: tuple[str, ...]) -> int:
    """How many trailing characters of `text` a stream must not send yet: the longest tail
    that could still grow into a stop string."""
    hold = 0
    for stop in stops:
        for size in range(min(len(stop) - 1, len(text)), hold, -1):
            if text.endswith(stop[:size]):
                hold = size
                break
    return hold


class Detokenizer:
    """The text of a growing list of tokens, one token at a time, for the cost of decoding a
    short window (the tokens since the last complete piece of text, and those of that piece)
    instead of the whole output at every token. A token that ends inside a character (a
    byte-level tokenizer's first bytes of a multi-byte one, decoded as "\\ufffd") gives no
    text until the tokens that complete it arrive. After vLLM's incremental detokenizer."""

    def __init__(self, decode: Callable[[list[int]], str]) -> None:
        self._decode = decode
        self.ids: list[int] = []
        self._prefix = 0  # the window starts here: the tokens of the last piece given out...
        self._read = 0  # ...which ends here

    def add(self, token: int) -> str:
        """Append `token`; the text it completes (possibly empty)."""
        self.ids.append(token)
        before = self._decode(self.ids[self._prefix : self._read])
        window = self._decode(self.ids[self._prefix :])
        if len(window) > len(before) and not window.endswith("\ufffd"):
            self._prefix, self._read = self._read, len(self.ids)
            return window[len(before) :]
        return ""

    def rest(self) -> str:
        """Whatever text is still held back (incomplete characters, decoded as they are)."""
        before = self._decode(self.ids[self._prefix : self._read])
        window = self._decode(self.ids[self._prefix :])
        self._prefix = self._read = len(self.ids)
        return window[len(before) :]


@dataclass(slots=True)
class _End:
    """The last item a generation thread queues: how it ended, or why it failed."""

    finish_reason: str
    completion_tokens: int
    error: BaseException | None = None


@dataclass(slots=True)
class _Outcome:
    """How a generation ended, filled in once its pieces run out."""

    finish_reason: str = "length"
    completion_tokens: int = 0


class TransformersRuntime(Runtime):
    endpoints = frozenset({Endpoint.CHAT, Endpoint.COMPLETIONS})

    def __init__(self, model: str, spec: ModelSpec, instance_id: str) -> None:
        super().__init__(model, spec, instance_id)
        assert spec.transformers is not None  # ModelSpec requires it for this runtime
        self.params: TransformersParams = spec.transformers
        self._torch: Any = None
        self._model: Any = None
        self._tokenizer: Any = None
        self._device: Any = None
        self._forward: Callable[[Any, Any], Any] | None = None
        self._tokenizer_lock = threading.Lock()
        self._eos: frozenset[int] = frozenset()
        self.context: int | None = None
        """The model's context window in tokens (prompt + generation), if its config says."""

    # --- loading ---------------------------------------------------------------------------

    async def load(self) -> None:
        await asyncio.to_thread(self._load)

    def _load(self) -> None:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
        os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
        import torch
        import transformers as hf

        transformers: Any = hf  # (untyped in places; its types add nothing here)
        transformers.utils.logging.disable_progress_bar()
        self._torch = torch
        params = self.params
        device = params.device
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        if device == "cpu":
            torch.set_num_threads(params.cpu_threads)
        dtype: Any = "auto" if params.dtype == "auto" and device != "cpu" else None
        if params.dtype != "auto":
            dtype = getattr(torch, params.dtype)
        elif device == "cpu":
            dtype = torch.float32  # half precision on CPU is slow where it works at all
        path = params.model_path
        self._tokenizer = transformers.AutoTokenizer.from_pretrained(path, local_files_only=True)
        model = transformers.AutoModelForCausalLM.from_pretrained(
            path, local_files_only=True, dtype=dtype
        )
        self._model = model.to(device).eval()
        self._device = torch.device(device)
        self._forward = _forward_fn(self._model)
        config = self._model.config
        self.context = next(
            (
                value
                for name in _CONTEXT_FIELDS
                if isinstance(value := getattr(config, name, None), int) and value > 0
            ),
            None,
        )
        self._eos = _eos_ids(self._model, self._tokenizer)
        # One short generation before /ready: first calls pay for lazy set-up (allocator,
        # kernels, the tokenizer's caches), the first caller should not.
        ids = self._encode(TextRequest(_WARMUP_PROMPT))
        self._decode_loop(ids, _WARMUP_TOKENS, TextRequest(_WARMUP_PROMPT, temperature=0.0))
        log.info(
            "model %r: %s on %s (%s), context %s tokens",
            self.model,
            type(self._model).__name__,
            device,
            self._model.dtype,
            self.context,
        )

    # --- requests --------------------------------------------------------------------------

    async def admit(self, request: TextRequest) -> None:
        """Render and count the prompt now, so a template error or a prompt that fills the
        context is a 400 even for a stream (generation tokenizes again: a prompt costs far
        more to prefill than to tokenize)."""
        ids = await asyncio.to_thread(self._encode, request)
        self._limit(request, len(ids))

    async def complete(self, request: TextRequest) -> Completion:
        ids, limit = await self._prepare(request)
        outcome = _Outcome()
        parts: list[str] = []
        async with aclosing(self._generate(ids, limit, request, outcome)) as pieces:
            async for piece in pieces:
                parts.append(piece)
        return Completion(
            "".join(parts), len(ids), outcome.completion_tokens, outcome.finish_reason
        )

    async def stream(self, request: TextRequest) -> TokenStream:
        """Tokenizes now; the generation itself starts when the first piece is asked for, so
        a stream closed before that (its client left while it waited) costs nothing."""
        ids, limit = await self._prepare(request)
        outcome = _Outcome()

        async def pieces() -> AsyncGenerator[str, None]:
            async with aclosing(self._generate(ids, limit, request, outcome)) as inner:
                async for piece in inner:
                    yield piece
            tokens.finish_reason = outcome.finish_reason
            tokens.completion_tokens = outcome.completion_tokens

        tokens = TokenStream(len(ids), "length", pieces())
        return tokens

    async def _prepare(self, request: TextRequest) -> tuple[list[int], int]:
        """The prompt's token ids (tokenized in a thread) and the tokens it may generate."""
        ids = await asyncio.to_thread(self._encode, request)
        return ids, self._limit(request, len(ids))

    async def _generate(
        self, ids: list[int], limit: int, request: TextRequest, outcome: _Outcome
    ) -> AsyncGenerator[str, None]:
        """Run the decode loop in a thread of its own and yield its text pieces; `outcome`
        says how it ended. However this generator stops (done, failed, cancelled, closed),
        the thread is told to stop and awaited, so a freed slot is a free core too."""
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[str | _End] = asyncio.Queue()
        cancel = threading.Event()
        finished: asyncio.Future[None] = loop.create_future()

        def put(item: str | _End) -> None:
            try:
                loop.call_soon_threadsafe(queue.put_nowait, item)
            except RuntimeError:  # the loop is closed: nobody is listening any more
                cancel.set()

        def run() -> None:
            try:
                finish, count = self._decode_loop(ids, limit, request, cancel, put)
                put(_End(finish, count))
            except BaseException as exc:
                put(_End("error", 0, exc))
            finally:
                with contextlib.suppress(RuntimeError):  # (a closed loop, as in `put`)
                    loop.call_soon_threadsafe(_settle, finished)

        threading.Thread(target=run, name=f"generate-{self.model}", daemon=True).start()
        try:
            while True:
                item = await queue.get()
                if isinstance(item, str):
                    yield item
                    continue
                if item.error is not None:
                    raise item.error
                outcome.finish_reason = item.finish_reason
                outcome.completion_tokens = item.completion_tokens
                return
        finally:
            cancel.set()
            await asyncio.shield(finished)

    def _limit(self, request: TextRequest, prompt_tokens: int) -> int:
        """Tokens this request may generate: its max_tokens, lowered to the spec's cap and to
        what the context leaves after the prompt."""
        cap = self.params.max_new_tokens
        limit = min(request.max_tokens or cap, cap)
        if self.context is not None:
            room = self.context - prompt_tokens
            if room < 1:
                raise ContextLengthExceeded(
                    f"the prompt is {prompt_tokens} tokens but model {self.model!r} has a "
                    f"context of {self.context} tokens, leaving no room to generate; "
                    "shorten the prompt"
                )
            limit = min(limit, room)
        return limit

    # --- in the generation thread -----------------------------------------------------------

    def _encode(self, request: TextRequest) -> list[int]:
        """The prompt's token ids: a chat rendered by the tokenizer's chat template (or the
        fallback), a text completion's prompt as given."""
        tokenizer = self._tokenizer
        with self._tokenizer_lock:
            if request.messages is None:
                ids = list(tokenizer(request.prompt)["input_ids"])
            elif getattr(tokenizer, "chat_template", None):
                messages = [{"role": role, "content": text} for role, text in request.messages]
                try:
                    text = tokenizer.apply_chat_template(
                        messages, add_generation_prompt=True, tokenize=False
                    )
                except Exception as exc:  # jinja2's TemplateError, raise_exception(...)
                    raise TemplateError(
                        f"model {self.model!r}'s chat template refused the messages: {exc}"
                    ) from None
                # The template writes the special tokens it wants (BOS and the like).
                ids = list(tokenizer(text, add_special_tokens=False)["input_ids"])
            else:
                ids = list(tokenizer(fallback_chat_prompt(request.messages))["input_ids"])
        if ids:
            return ids
        # An empty prompt: start from BOS (or EOS, as GPT-2 does), as generate() would.
        start = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else None
        if start is None and self._eos:
            start = min(self._eos)
        if start is None:
            raise TemplateError(f"the prompt is empty and model {self.model!r} has no BOS token")
        return [int(start)]

    def _decode(self, ids: list[int]) -> str:
        with self._tokenizer_lock:
            text: str = self._tokenizer.decode(
                ids, skip_special_tokens=True, clean_up_tokenization_spaces=False
            )
        return text

    def _decode_loop(
        self,
        prompt: list[int],
        limit: int,
        request: TextRequest,
        cancel: threading.Event | None = None,
        emit: Callable[[str], None] | None = None,
    ) -> tuple[str, int]:
        """Generate up to `limit` tokens after `prompt`, sending text to `emit` as it becomes
        final; returns (finish_reason, tokens sampled). Finish reasons: "stop" (EOS or a stop
        string), "length" (the limit), "cancelled" (the caller went away)."""
        torch = self._torch
        assert self._forward is not None
        stops = tuple(s for s in request.stop if s)
        temperature = 1.0 if request.temperature is None else request.temperature
        top_p = 1.0 if request.top_p is None else request.top_p
        generator = torch.Generator(device=self._device)
        if request.seed is None:
            generator.seed()
        else:
            generator.manual_seed(request.seed)
        text = Detokenizer(self._decode)
        output = ""  # the text so far
        sent = 0  # characters of it already emitted
        eos = False
        with torch.inference_mode():
            cache = _new_cache(self._model)
            step = torch.tensor([prompt], device=self._device)
            while len(text.ids) < limit:
                if cancel is not None and cancel.is_set():
                    return "cancelled", len(text.ids)
                logits = self._forward(step, cache)
                token = _sample(torch, logits, temperature, top_p, generator)
                if token in self._eos:
                    eos = True
                    break
                searched = len(output)
                output += text.add(token)
                at = find_stop(output, stops, searched)
                if at is not None:
                    if emit is not None and at > sent:
                        emit(output[sent:at])
                    return "stop", len(text.ids)
                ready = len(output) - held_back(output, stops)
                if emit is not None and ready > sent:
                    emit(output[sent:ready])
                    sent = ready
                step = torch.tensor([[token]], device=self._device)
        # What is still held back: the start of a stop string that never completed, or a
        # character the last token left incomplete.
        searched = len(output)
        output += text.rest()
        at = find_stop(output, stops, searched)
        if at is not None:
            output = output[:at]
        if emit is not None and len(output) > sent:
            emit(output[sent:])
        finish = "stop" if eos or at is not None else "length"
        return finish, len(text.ids) + eos  # EOS is a token sampled too


def _settle(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


def _forward_fn(model: Any) -> Callable[[Any, Any], Any]:
    """`forward(input_ids, cache) -> last position's logits`, with the keyword names this
    transformers release uses (the cache argument was renamed `past_key_values` -> `cache`
    within 5.x; `logits_to_keep` spares computing logits for every prompt position)."""
    names = inspect.signature(model.forward).parameters
    cache_kw = "cache" if "cache" in names else "past_key_values"
    extra: dict[str, Any] = {"logits_to_keep": 1} if "logits_to_keep" in names else {}

    def forward(input_ids: Any, cache: Any) -> Any:
        out = model(input_ids=input_ids, use_cache=True, **{cache_kw: cache}, **extra)
        return out.logits[0, -1, :]

    return forward


def _new_cache(model: Any) -> Any:
    from transformers import DynamicCache

    return DynamicCache(config=model.config)


def _eos_ids(model: Any, tokenizer: Any) -> frozenset[int]:
    """Token ids that end a generation: the generation config's EOS (one or a list) and the
    tokenizer's."""
    ids: set[int] = set()
    configured = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    for value in (configured, tokenizer.eos_token_id):
        if isinstance(value, int):
            ids.add(value)
        elif isinstance(value, list | tuple):
            ids.update(v for v in value if isinstance(v, int))
    return frozenset(ids)


def _sample(torch: Any, logits: Any, temperature: float, top_p: float, generator: Any) -> int:
    """The next token: greedy at temperature 0, else drawn from the softmax at
    `temperature`, kept to the smallest set of tokens whose probability reaches `top_p`."""
    if temperature <= 0:
        return int(logits.argmax())
    probs = torch.softmax(logits.float() / temperature, dim=-1)
    if top_p < 1.0:
        sorted_probs, order = probs.sort(descending=True)
        outside = sorted_probs.cumsum(-1) - sorted_probs >= top_p  # the first always stays
        sorted_probs[outside] = 0.0
        probs = torch.zeros_like(probs).scatter(-1, order, sorted_probs)
    return int(torch.multinomial(probs, 1, generator=generator))
