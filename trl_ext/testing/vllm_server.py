"""vLLM server mode without vLLM: a loopback HTTP server and TRL's real client code pointed at it.

`LoopbackVLLMServer` speaks the subset of vLLM's OpenAI-compatible API that TRL's `VLLMClient` uses (`/health`,
`/v1/models`, `/server_info`, `/v1/completions` with token-id prompts, `n`, `logprobs`, `return_token_ids`,
`return_tokens_as_token_ids`, and the weight-update endpoints), backed by a copy of a small transformers model.

`vllm_server_mode(server)` lets a trainer with `use_vllm=True, vllm_mode="server"` run TRL's own
`VLLMGeneration` and `VLLMClient` against it. It patches only what needs vLLM or CUDA:

- the `is_vllm_available` checks in `trl.generation` (vLLM is not installed);
- the NCCL weight transfer: `init_communicator` opens an in-process channel instead of an NCCL group, and the
  tensors TRL broadcasts go through that channel into the server's model, while the HTTP requests that announce and
  frame the update (`/start_weight_update`, `/update_weights`, `/finish_weight_update`) are TRL's own.

Everything between the trainer and the HTTP request (prompt de-duplication, `gather_object`/broadcast, slicing per
process, log-prob parsing, the importance-sampling correction) is TRL's code. The server's log-probs are the
temperature-scaled log-softmax of its model (vLLM's `processed_logprobs` without top-k/top-p truncation), so with
the same weights TRL's importance-sampling ratio is 1 up to float error (unless `perturb` is set).
"""

from __future__ import annotations

import copy
import json
import queue
import threading
import time
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from unittest import mock

import torch


class LoopbackVLLMServer:
    """An OpenAI-compatible completions server on 127.0.0.1 backed by a copy of `model` (CPU, thread-safe).

    `script(prompt_text, sample_index) -> str`, if given, writes the completions instead of sampling (as
    `ScriptedGeneration`, with `sample_index` the index among the request's `n` samples of that prompt); the text gets
    the end-of-sequence token, is cut at `max_tokens` and `stop`, and its log-probs are the server model's. Generation then
    still goes through TRL's real server-mode path (gather, de-duplication, broadcast, per-process slicing).

    Request fields honoured as vLLM does: `stop` (the completion ends at the token that completes one), `seed` (the
    same seed gives the same samples), and the model's generation config's EOS ids end a completion. `perturb`
    adds seeded noise to the weights at start and after each update, so log-probs differ from the trainer's and
    TRL's importance-sampling ratio moves off 1. Structured outputs are recorded, not enforced.

    `max_model_len` (default: the model's `max_position_embeddings`) is the context, reported in `/server_info` as
    vLLM does: a request with a prompt whose length plus `max_tokens` exceeds it fails whole (HTTP 400).

    Attributes:
        requests: every answered `/v1/completions` request body and its choices, in order.
        weight_updates: number of completed weight updates.
    """

    def __init__(
        self,
        model,
        tokenizer,
        model_name: str = "loopback-model",
        script=None,
        max_model_len: int | None = None,
        perturb: float = 0.0,
    ):
        self.model = copy.deepcopy(model).eval()
        self.tokenizer = tokenizer
        self.model_name = model_name
        self.script = script
        self.max_model_len = max_model_len or model.config.max_position_embeddings
        self.perturb = perturb
        eos = model.generation_config.eos_token_id
        eos = [] if eos is None else [eos] if isinstance(eos, int) else list(eos)
        # vLLM stops on every EOS id of the model's generation config, not only the tokenizer's
        self.eos_token_ids = list(dict.fromkeys([*eos, tokenizer.eos_token_id]))
        self.requests: list[dict] = []
        self.weight_updates = 0
        self._perturb_weights()
        self._lock = threading.Lock()
        self._incoming: queue.Queue = queue.Queue()  # the tensors TRL "broadcasts", in announced order
        self._httpd: ThreadingHTTPServer | None = None

    # -- lifecycle ---------------------------------------------------------------------------------------------------
    @property
    def base_url(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> LoopbackVLLMServer:
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # keep test output clean
                pass

            def _reply(self, status: int, body: dict | None):
                data = json.dumps(body).encode() if body is not None else b""
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                self._dispatch(server._routes_get)

            def do_POST(self):
                self._dispatch(server._routes_post)

            def _dispatch(self, routes):
                route = routes.get(self.path.split("?", 1)[0])
                if route is None:
                    return self._reply(404, {"error": f"no route {self.path}"})
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length)) if length else {}
                try:
                    self._reply(200, route(body))
                except Exception as e:  # report to the client, which raises with this text
                    self._reply(400, {"error": f"{type(e).__name__}: {e}"})

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        threading.Thread(target=self._httpd.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None

    def __enter__(self) -> LoopbackVLLMServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # -- routes ------------------------------------------------------------------------------------------------------
    @property
    def _routes_get(self):
        return {
            "/health": lambda body: {},
            "/v1/models": lambda body: {"object": "list", "data": [{"id": self.model_name, "object": "model"}]},
            "/server_info": lambda body: {
                "vllm_config": {
                    "model_config": {"logprobs_mode": "processed_logprobs", "max_model_len": self.max_model_len},
                    "weight_transfer_config": {"backend": "nccl"},
                }
            },
            "/get_world_size": lambda body: {"world_size": 1},
        }

    @property
    def _routes_post(self):
        return {
            "/v1/completions": self._completions,
            "/reset_prefix_cache": lambda body: {"success": True},
            "/init_weight_transfer_engine": lambda body: {},
            "/start_weight_update": lambda body: {},
            "/update_weights": self._update_weights,
            "/finish_weight_update": self._finish_weight_update,
        }

    def _update_weights(self, body: dict) -> dict:
        params = dict(self.model.named_parameters())
        with self._lock, torch.no_grad():
            for name in body["update_info"]["names"]:
                sent_name, tensor = self._incoming.get(timeout=120)
                if sent_name != name:
                    raise ValueError(f"weight stream out of order: announced {name!r}, received {sent_name!r}")
                params[name].copy_(tensor.to(params[name].dtype))
        return {}

    def _finish_weight_update(self, body: dict) -> dict:
        self._perturb_weights()
        self.weight_updates += 1
        return {}

    @torch.no_grad()
    def _perturb_weights(self) -> None:
        """With `perturb`, add seeded noise of that relative scale to the weights, as a stand-in for the numerical
        differences of a real inference engine (bf16 kernels): the sampler's log-probs then differ from the trainer's,
        and TRL's importance-sampling ratio from 1."""
        if not self.perturb:
            return
        generator = torch.Generator().manual_seed(self.weight_updates)
        for param in self.model.parameters():
            noise = torch.randn(param.shape, generator=generator, dtype=torch.float32).to(param.dtype)
            param.add_(noise * self.perturb * param.abs().mean())

    def _completions(self, body: dict) -> dict:
        prompts = body["prompt"]
        if not prompts or not isinstance(prompts[0], list):
            raise ValueError("this server takes token-id prompts only (a list of lists of ints)")
        n = int(body.get("n", 1))
        max_tokens = int(body.get("max_tokens", 16))
        for prompt_ids in prompts:  # as vLLM's OpenAI server: the whole request fails
            if len(prompt_ids) + max_tokens > self.max_model_len:
                raise ValueError(
                    f"This model's maximum context length is {self.max_model_len} tokens. However, you requested "
                    f"{len(prompt_ids) + max_tokens} tokens ({len(prompt_ids)} in the messages, {max_tokens} in the "
                    "completion). Please reduce the length of the messages or completion."
                )
        choices = []
        with self._lock:
            for prompt_ids in prompts:
                for completion_ids, logps in self._sample(prompt_ids, n, body):
                    choices.append(self._choice(len(choices), prompt_ids, completion_ids, logps, body))
        self.requests.append({"body": body, "choices": choices})
        return {
            "id": f"cmpl-{len(self.requests)}",
            "object": "text_completion",
            "created": int(time.time()),
            "model": self.model_name,
            "choices": choices,
        }

    def _choice(self, index, prompt_ids, completion_ids, logps, body) -> dict:
        logprobs = None
        if body.get("logprobs") is not None:
            tokens = [f"token_id:{t}" for t in completion_ids]
            logprobs = {
                "tokens": tokens,
                "token_logprobs": logps,
                "top_logprobs": [{tok: lp} for tok, lp in zip(tokens, logps, strict=True)],
            }
        finished = bool(completion_ids) and (
            completion_ids[-1] in self.eos_token_ids or self._stopped(completion_ids, body)
        )
        return {
            "index": index,
            "text": self.tokenizer.decode(completion_ids, skip_special_tokens=True),
            "prompt_token_ids": list(prompt_ids),
            "token_ids": completion_ids,
            "logprobs": logprobs,
            "finish_reason": "stop" if finished else "length",
        }

    def _stopped(self, completion_ids: list[int], body: dict) -> bool:
        stop = body.get("stop") or []
        text = self.tokenizer.decode(completion_ids, skip_special_tokens=True)
        return any(s in text for s in ([stop] if isinstance(stop, str) else stop))

    def _cut_at_stop(self, completion_ids: list[int], body: dict) -> list[int]:
        """vLLM ends a completion at the first token whose text completes a `stop` string."""
        stop = body.get("stop") or []
        stop = [stop] if isinstance(stop, str) else stop
        for end in range(1, len(completion_ids) + 1):
            text = self.tokenizer.decode(completion_ids[:end], skip_special_tokens=True)
            if any(s in text for s in stop):
                return completion_ids[:end]
        return completion_ids

    @torch.no_grad()
    def _sample(self, prompt_ids: list[int], n: int, body: dict) -> list[tuple[list[int], list[float]]]:
        seed = body.get("seed")
        if seed is None:
            return self._sample_unseeded(prompt_ids, n, body)
        with torch.random.fork_rng():  # as vLLM's per-request generator: the same seed, the same samples
            torch.manual_seed(int(seed))
            return self._sample_unseeded(prompt_ids, n, body)

    def _sample_unseeded(self, prompt_ids: list[int], n: int, body: dict) -> list[tuple[list[int], list[float]]]:
        temperature = float(body.get("temperature", 1.0))
        if self.script is not None:
            text = self.tokenizer.decode(prompt_ids)
            scripted = [
                self.tokenizer.encode(self.script(text, j), add_special_tokens=False) + [self.tokenizer.eos_token_id]
                for j in range(n)
            ]
            scripted = [self._cut_at_stop(ids[: int(body.get("max_tokens", 16))], body) for ids in scripted]
            return [(ids, self._logprobs(prompt_ids, ids, max(temperature, 1e-6))) for ids in scripted]
        top_k = int(body.get("top_k") or 0)
        min_p = float(body.get("min_p") or 0.0)
        eos = self.eos_token_ids
        input_ids = torch.tensor([prompt_ids])
        output = self.model.generate(
            input_ids,
            attention_mask=torch.ones_like(input_ids),
            do_sample=temperature > 0,
            temperature=temperature if temperature > 0 else None,
            top_p=float(body.get("top_p", 1.0)),
            top_k=top_k if top_k > 0 else None,
            min_p=min_p if min_p > 0 else None,
            repetition_penalty=float(body.get("repetition_penalty", 1.0)),
            max_new_tokens=int(body.get("max_tokens", 16)),
            num_return_sequences=n,
            eos_token_id=eos,
            pad_token_id=self.tokenizer.pad_token_id,
        )
        results = []
        for row in output[:, len(prompt_ids) :].tolist():
            end = next((i for i, t in enumerate(row) if t in eos), None)
            completion = self._cut_at_stop(row if end is None else row[: end + 1], body)
            results.append((completion, self._logprobs(prompt_ids, completion, max(temperature, 1e-6))))
        return results

    def _logprobs(self, prompt_ids: list[int], completion_ids: list[int], temperature: float) -> list[float]:
        if not completion_ids:
            return []
        ids = torch.tensor([prompt_ids + completion_ids])
        logits = self.model(input_ids=ids).logits[0, len(prompt_ids) - 1 : -1].float() / temperature
        logps = torch.log_softmax(logits, dim=-1).gather(-1, torch.tensor(completion_ids).unsqueeze(-1))
        return logps.squeeze(-1).tolist()


@dataclass
class _ChannelArgs:
    """Stands in for vLLM's `NCCLTrainerSendWeightsArgs`."""

    group: LoopbackVLLMServer
    packed: bool = True


class _LoopbackWeightTransfer:
    """Stands in for vLLM's `NCCLWeightTransferEngine` on the trainer side: hands tensors to the server in-process."""

    @staticmethod
    def trainer_send_weights(iterator, trainer_args: _ChannelArgs) -> None:
        for name, tensor in iterator:
            trainer_args.group._incoming.put((name, tensor.detach().cpu().clone()))


@contextmanager
def vllm_server_mode(server: LoopbackVLLMServer):
    """Patch TRL's vLLM availability checks and NCCL weight transfer so server mode talks to `server`.

    Build the trainer inside the context with `use_vllm=True, vllm_mode="server",
    vllm_server_base_url=server.base_url`.
    """
    import trl.generation.vllm_client as vllm_client
    import trl.generation.vllm_generation as vllm_generation

    def init_communicator(client, device=0):
        client.communicator = server

    with ExitStack() as stack:
        stack.enter_context(mock.patch.object(vllm_generation, "is_vllm_available", lambda *a, **k: True))
        stack.enter_context(mock.patch.object(vllm_client, "is_vllm_available", lambda *a, **k: True))
        stack.enter_context(mock.patch.object(vllm_client.VLLMClient, "init_communicator", init_communicator))
        stack.enter_context(mock.patch.object(vllm_client, "_HAS_STATEFUL_TRAINER_ENGINE", False))
        stack.enter_context(
            mock.patch.object(vllm_client, "NCCLWeightTransferEngine", _LoopbackWeightTransfer, create=True)
        )
        stack.enter_context(mock.patch.object(vllm_client, "NCCLTrainerSendWeightsArgs", _ChannelArgs, create=True))
        yield server
