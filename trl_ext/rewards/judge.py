"""An LLM-judge reward function for any OpenAI-compatible chat endpoint (`vllm serve`, TGI, a hosted API).

[`LLMJudge`] is an async reward function in TRL's signature: TRL runs async reward functions concurrently on its
event loop thread, and the judge requests of one batch run concurrently too, at most `max_concurrency` at a time.
Requests go through the `openai` client (the `judge` extra: `pip install trl-ext[judge]`), which provides the
per-attempt `timeout` and the `max_retries` retries with exponential backoff (on timeouts, connection errors, 408,
409, 429 and 5xx). A judge that stays unreachable, answers garbage, or replies without a score in [0, 1] gives
`None` for that row (TRL: not applicable, excluded from the baselines) and is counted in the `<name>/failures`
metric, never an exception. Scores are cached by request (model, messages, sampling settings), so a repeated
completion is judged once; failures are not cached.

Everything the endpoint sends is bounded: the HTTP body of a reply (success or error) is read up to `max_reply_bytes`
(an uncompressed body is asked for and a compressed one refused, so the cap is on what is held in memory) and a larger
one is a failure without retry; the score is read from the reply text in linear time. The judge runs on the event loop
that every async reward function shares, so a slow parse or a huge body would stall all of them.

The API key is read from the environment variable `api_key_env` at each call, into that call's client, which is
closed when the call ends: the judge itself never holds it (nor does its `repr`), and it is never printed or logged.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import importlib
import json
import os
import re
from collections import Counter, OrderedDict
from collections.abc import Callable, Mapping
from typing import Any

from ..core.model_text import neutralize_special_tokens
from .parsing import completion_text


# The last line of a reply holds the score: "0.8", "1", "Score: 0.25", "score = .5" (optionally in a <score> tag).
# Only the number is a regular expression (no nested or adjacent quantifiers); the optional parts around it are peeled
# off one at a time by `parse_judge_score`, so a line is read in linear time.
_NUMBER = re.compile(r"[01](?:\.[0-9]+)?|\.[0-9]+")
_MAX_REPLY_CHARS = 2_000
_LINE_BREAK = re.compile(r"\r\n|\r|\n")
# TRL's own keyword arguments to reward functions: not per-row columns.
_NOT_COLUMNS = {"trainer_state", "log_extra", "log_metric", "completion_ids"}

DEFAULT_RUBRIC = (
    "You are a strict grader. Read the task and the response, then judge how well the response completes the task. "
    "Reply with a single number between 0 and 1 on the last line (1 = fully completed, 0 = not at all)."
)

Messages = list[dict[str, str]]
RenderFn = Callable[[Any, Any, Mapping[str, Any]], Messages]


def parse_judge_score(reply: Any) -> float | None:
    """The score in a judge reply (its last non-empty line, a number in [0, 1]), or `None`. Never raises.

    The line is `[score [:|=]] [<score>] NUMBER [</score>] [.]`, case-insensitive, with any whitespace between
    the parts.
    """
    if not isinstance(reply, str) or len(reply) > _MAX_REPLY_CHARS:
        return None
    # Lines end at \n, \r or \r\n only: `str.splitlines` also breaks at U+2028, U+0085, form feeds and other
    # separators, so a reply "0<U+2028>1" (one line, not a score) would read as 1.0.
    lines = [line.strip() for line in _LINE_BREAK.split(reply) if line.strip()]
    if not lines:
        return None
    line = _strip_prefix(lines[-1], "score")
    if line != lines[-1] and line[:1] in (":", "="):  # a separator only after "score"
        line = line[1:].lstrip()
    line = _strip_prefix(line, "<score>")
    line = line.removesuffix(".")
    if line.lower().endswith("</score>"):
        line = line[: -len("</score>")]
    line = line.rstrip()
    if _NUMBER.fullmatch(line) is None:
        return None
    value = float(line)
    return value if 0.0 <= value <= 1.0 else None


def _strip_prefix(line: str, prefix: str) -> str:
    """`line` without `prefix` (any case) and the whitespace after it, else `line`."""
    return line[len(prefix) :].lstrip() if line[: len(prefix)].lower() == prefix else line


def _http_module():
    """The HTTP library the installed `openai` client is built on: `httpx2` from openai 3, `httpx` before."""
    import openai

    return importlib.import_module("httpx2" if int(openai.__version__.split(".")[0]) >= 3 else "httpx")


@functools.cache
def _capped_transport():
    """The class of an HTTP transport that reads at most `limit` bytes of any response body.

    Built on first use, from the `openai` client's HTTP library (an optional dependency). The error it raises is an
    `openai.OpenAIError`, which the client passes on without retrying: an oversized reply will not shrink.
    """
    import openai

    http = _http_module()

    class JudgeReplyTooLarge(openai.OpenAIError):
        pass

    class CappedStream(http.AsyncByteStream):
        def __init__(self, stream, limit: int):
            self.stream, self.limit = stream, limit

        async def __aiter__(self):
            size = 0
            async for chunk in self.stream:
                size += len(chunk)
                if size > self.limit:
                    raise JudgeReplyTooLarge(f"the judge's reply body is longer than {self.limit} bytes")
                yield chunk

        async def aclose(self):
            await self.stream.aclose()

    class CappedTransport(http.AsyncHTTPTransport):
        def __init__(self, limit: int):
            super().__init__()
            self.limit = limit

        async def handle_async_request(self, request):
            # Uncompressed only: the cap then bounds what is held in memory (a compressed body could expand past it).
            request.headers["Accept-Encoding"] = "identity"
            response = await super().handle_async_request(request)
            declared = response.headers.get("Content-Length", "")
            if response.headers.get("Content-Encoding", "identity").lower() != "identity" or (
                declared.isdigit() and int(declared) > self.limit
            ):
                await response.aclose()
                raise JudgeReplyTooLarge(f"the judge's reply is compressed or longer than {self.limit} bytes")
            response.stream = CappedStream(response.stream, self.limit)
            return response

    return CappedTransport


def default_render(rubric: str = DEFAULT_RUBRIC) -> RenderFn:
    """Judge messages for a prompt and a completion: the rubric as the system message, then the task (the prompt's
    last message) and the response (the completion's text), with their special-token strings made plain text (the
    endpoint's chat template would read a `<|im_end|>` in the response as the end of the judge's user turn)."""

    def render(prompt: Any, completion: Any, row: Mapping[str, Any]) -> Messages:
        task = completion_text(prompt[-1:] if isinstance(prompt, list) else prompt)
        content = f"Task:\n{task}\n\nResponse:\n{completion_text(completion)}"
        return [{"role": "system", "content": rubric}, {"role": "user", "content": neutralize_special_tokens(content)}]

    return render


class LLMJudge:
    """Async reward function scoring each completion with an LLM judge.

    Args:
        base_url: The endpoint, e.g. `"http://localhost:8000/v1"` for `vllm serve`.
        model: The judge model's name at that endpoint.
        name: The reward's name (the column, metric prefix and what `learnability_criteria` refer to).
        render: `f(prompt, completion, row) -> messages` builds the judge request; `row` holds this completion's
            dataset columns and, with an `environment_factory`, its `environment`. Defaults to `default_render()`.
        api_key_env: Environment variable holding the API key (unset: a placeholder key, as local servers expect).
        max_concurrency: At most this many requests in flight.
        timeout: Seconds per attempt.
        max_retries: Retries after a failed attempt (exponential backoff, by the `openai` client).
        max_tokens: Longest judge reply.
        temperature: Judge sampling temperature (0: the same request gives the same score, which the cache assumes).
        cache_size: Scores kept (least recently used dropped first).
        max_reply_bytes: Largest HTTP body read from the endpoint (a reply or an error); a larger one is a failure.
            A chat completion of `max_tokens` tokens is a few kilobytes; raise it only for very long judge replies.
    """

    def __init__(
        self,
        base_url: str,
        model: str,
        name: str = "llm_judge",
        render: RenderFn | None = None,
        api_key_env: str = "JUDGE_API_KEY",
        max_concurrency: int = 8,
        timeout: float = 30.0,
        max_retries: int = 2,
        max_tokens: int = 16,
        temperature: float = 0.0,
        cache_size: int = 10_000,
        max_reply_bytes: int = 1_000_000,
    ):
        try:
            import openai  # noqa: F401 - fail at construction, not at the first batch
        except ImportError as error:
            raise ImportError("LLMJudge needs the `openai` client: pip install 'trl-ext[judge]'.") from error
        for field_name, value in (
            ("max_concurrency", max_concurrency),
            ("cache_size", cache_size),
            ("max_tokens", max_tokens),
            ("max_reply_bytes", max_reply_bytes),
        ):
            if value < 1:
                raise ValueError(f"LLMJudge {field_name} must be at least 1, got {value}.")
        if timeout <= 0 or max_retries < 0:
            raise ValueError(f"LLMJudge needs timeout > 0 and max_retries >= 0, got {timeout} and {max_retries}.")
        self.__name__ = name
        self.base_url, self.model, self.render = base_url, model, render or default_render()
        self.api_key_env, self.max_concurrency, self.timeout = api_key_env, max_concurrency, timeout
        self.max_retries, self.max_tokens, self.temperature = max_retries, max_tokens, temperature
        self.cache_size, self.max_reply_bytes = cache_size, max_reply_bytes
        self._cache: OrderedDict[str, float] = OrderedDict()
        self.stats: Counter = Counter()  # requests, cache_hits, failures (cumulative)

    def __repr__(self) -> str:
        return f"LLMJudge(name={self.__name__!r}, model={self.model!r}, base_url={self.base_url!r})"

    def _request(self, messages: Messages) -> dict[str, Any]:
        return {
            "model": self.model,
            "messages": messages,
            "temperature": self.temperature,
            "max_tokens": self.max_tokens,
        }

    async def _score(self, client, semaphore: asyncio.Semaphore, messages: Messages) -> float | None:
        """The judge's score for one request, or `None` (unreachable, HTTP error, garbled or non-numeric reply)."""
        request = self._request(messages)
        key = hashlib.sha256(json.dumps(request, sort_keys=True, default=str).encode()).hexdigest()
        if key in self._cache:
            self._cache.move_to_end(key)
            self.stats["cache_hits"] += 1
            return self._cache[key]
        async with semaphore:
            self.stats["requests"] += 1
            try:
                response = await client.chat.completions.create(**request)
                reply = response.choices[0].message.content
            except Exception:  # any judge failure (network, HTTP, malformed body) is a None score
                reply = None
        value = parse_judge_score(reply)
        if value is None:
            self.stats["failures"] += 1
            return None
        self._cache[key] = value
        if len(self._cache) > self.cache_size:
            self._cache.popitem(last=False)
        return value

    async def __call__(self, prompts, completions, log_metric=None, environments=None, **kwargs):
        columns = {
            k: v
            for k, v in kwargs.items()
            if k not in _NOT_COLUMNS and isinstance(v, list) and len(v) == len(completions)
        }
        requests = []
        for i, (prompt, completion) in enumerate(zip(prompts, completions, strict=True)):
            row = {k: v[i] for k, v in columns.items()}
            if environments is not None:
                row["environment"] = environments[i]
            requests.append(self.render(prompt, completion, row))
        before = Counter(self.stats)
        from openai import AsyncOpenAI

        # A client per call keeps the key off the judge, and the client and semaphore on the event loop awaiting them
        # (TRL's loop thread, or any other). Its cost (a client, connections opened anew) is small beside a batch.
        http_client = _http_module().AsyncClient(
            transport=_capped_transport()(self.max_reply_bytes), follow_redirects=True
        )
        async with AsyncOpenAI(
            base_url=self.base_url,
            api_key=os.environ.get(self.api_key_env) or "EMPTY",
            timeout=self.timeout,
            max_retries=self.max_retries,
            http_client=http_client,
        ) as client:
            semaphore = asyncio.Semaphore(self.max_concurrency)
            scores = await asyncio.gather(*(self._score(client, semaphore, messages) for messages in requests))
        if log_metric is not None:
            for stat in ("failures", "cache_hits", "requests"):
                log_metric(f"{self.__name__}/{stat}", float(self.stats[stat] - before[stat]))
        return list(scores)
