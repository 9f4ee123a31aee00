"""An LLM-judge reward function for any OpenAI-compatible chat endpoint (`vllm serve`, TGI, a hosted API).

[`LLMJudge`] is an async reward function in TRL's signature: TRL runs async reward functions concurrently on its
event loop thread, and the judge requests of one batch run concurrently too, at most `max_concurrency` at a time.
Requests go through the `openai` client (the `judge` extra: `pip install trl-ext[judge]`), which provides the
per-attempt `timeout` and the `max_retries` retries with exponential backoff (on timeouts, connection errors, 408,
409, 429 and 5xx). A judge that stays unreachable, answers garbage, or replies without a score in [0, 1] gives
`None` for that row (TRL: not applicable, excluded from the baselines) and is counted in the `<name>/failures`
metric, never an exception. Scores are cached by request (model, messages, sampling settings), so a repeated
completion is judged once; failures are not cached.

The API key is read from the environment variable `api_key_env` at each call, into that call's client, which is
closed when the call ends: the judge itself never holds it (nor does its `repr`), and it is never printed or logged.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import re
from collections import Counter, OrderedDict
from collections.abc import Callable, Mapping
from typing import Any

from .parsing import completion_text


# The last line of a reply holds the score: "0.8", "1", "Score: 0.25", "score = .5" (optionally in a <score> tag).
_SCORE = re.compile(r"(?:score\s*[:=]?\s*)?(?:<score>)?\s*([01](?:\.[0-9]+)?|\.[0-9]+)\s*(?:</score>)?\.?",
                    re.IGNORECASE)
_MAX_REPLY_CHARS = 2_000
# TRL's own keyword arguments to reward functions: not per-row columns.
_NOT_COLUMNS = {"trainer_state", "log_extra", "log_metric", "completion_ids"}

DEFAULT_RUBRIC = (
    "You are a strict grader. Read the task and the response, then judge how well the response completes the task. "
    "Reply with a single number between 0 and 1 on the last line (1 = fully completed, 0 = not at all)."
)

Messages = list[dict[str, str]]
RenderFn = Callable[[Any, Any, Mapping[str, Any]], Messages]


def parse_judge_score(reply: Any) -> float | None:
    """The score in a judge reply (its last non-empty line, a number in [0, 1]), or `None`. Never raises."""
    if not isinstance(reply, str) or len(reply) > _MAX_REPLY_CHARS:
        return None
    lines = [line.strip() for line in reply.strip().splitlines() if line.strip()]
    match = _SCORE.fullmatch(lines[-1]) if lines else None
    if match is None:
        return None
    value = float(match.group(1))
    return value if 0.0 <= value <= 1.0 else None


def default_render(rubric: str = DEFAULT_RUBRIC) -> RenderFn:
    """Judge messages for a prompt and a completion: the rubric as the system message, then the task (the prompt's
    last message) and the response (the completion's text)."""

    def render(prompt: Any, completion: Any, row: Mapping[str, Any]) -> Messages:
        task = completion_text(prompt[-1:] if isinstance(prompt, list) else prompt)
        return [{"role": "system", "content": rubric},
                {"role": "user", "content": f"Task:\n{task}\n\nResponse:\n{completion_text(completion)}"}]

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
    """

    def __init__(self, base_url: str, model: str, name: str = "llm_judge", render: RenderFn | None = None,
                 api_key_env: str = "JUDGE_API_KEY", max_concurrency: int = 8, timeout: float = 30.0,
                 max_retries: int = 2, max_tokens: int = 16, temperature: float = 0.0, cache_size: int = 10_000):
        try:
            import openai  # noqa: F401 - fail at construction, not at the first batch
        except ImportError as error:
            raise ImportError("LLMJudge needs the `openai` client: pip install 'trl-ext[judge]'.") from error
        for field_name, value in (("max_concurrency", max_concurrency), ("cache_size", cache_size),
                                  ("max_tokens", max_tokens)):
            if value < 1:
                raise ValueError(f"LLMJudge {field_name} must be at least 1, got {value}.")
        if timeout <= 0 or max_retries < 0:
            raise ValueError(f"LLMJudge needs timeout > 0 and max_retries >= 0, got {timeout} and {max_retries}.")
        self.__name__ = name
        self.base_url, self.model, self.render = base_url, model, render or default_render()
        self.api_key_env, self.max_concurrency, self.timeout = api_key_env, max_concurrency, timeout
        self.max_retries, self.max_tokens, self.temperature = max_retries, max_tokens, temperature
        self.cache_size = cache_size
        self._cache: OrderedDict[str, float] = OrderedDict()
        self.stats: Counter = Counter()  # requests, cache_hits, failures (cumulative)

    def __repr__(self) -> str:
        return f"LLMJudge(name={self.__name__!r}, model={self.model!r}, base_url={self.base_url!r})"

    def _request(self, messages: Messages) -> dict[str, Any]:
        return {"model": self.model, "messages": messages, "temperature": self.temperature,
                "max_tokens": self.max_tokens}

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
            except Exception:  # noqa: BLE001 - any judge failure (network, HTTP, malformed body) is a None score
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
        columns = {k: v for k, v in kwargs.items() if k not in _NOT_COLUMNS and isinstance(v, list)
                   and len(v) == len(completions)}
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
        async with AsyncOpenAI(base_url=self.base_url, api_key=os.environ.get(self.api_key_env) or "EMPTY",
                               timeout=self.timeout, max_retries=self.max_retries) as client:
            semaphore = asyncio.Semaphore(self.max_concurrency)
            scores = await asyncio.gather(*(self._score(client, semaphore, messages) for messages in requests))
        if log_metric is not None:
            for stat in ("failures", "cache_hits", "requests"):
                log_metric(f"{self.__name__}/{stat}", float(self.stats[stat] - before[stat]))
        return list(scores)
