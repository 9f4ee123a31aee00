"""Prefill the prompt positions that rows share once, then generate as `model.generate` would.

On CPU a generation call costs mostly its prefill (the prompt's forward), and the trainers' prompts repeat: TRL's
sampler repeats every prompt `num_generations` times, RLCR asks `G_c` confidences of each answer on one prompt, the
sampling agreement asks k answers of each question, and every prompt of a built-in recipe opens with the same chat
template and system prompt. `shared_prefill_generate` computes the key/value cache of the prefix common to all rows
once, and that of each distinct rest of a prompt once, copies them to the rows that hold them, and lets
`model.generate` prefill only each row's last prompt token. vLLM caches prefixes itself; this is the transformers path.

The rows are laid out as `prefix | padding | rest` instead of `padding | prefix | rest`: the prefix then sits at the
same columns in every row, so one cache serves them all. The attention mask hides the padding and the position ids
count only unmasked tokens (as `generate` computes them), so every token sees the same context at the same position
as in the left-padded batch: the completions are those of the left-padded call, up to floating-point rounding of the
differently shaped matrix products. The returned sequences have the caller's left-padded prompt columns, so the
completions start where the caller expects.

Anything this layout does not cover (an encoder-decoder or vision-language model, PEFT prompt learning, a
sliding-window, recurrent or static cache, beams, several returned sequences per row, dict outputs, extra model inputs,
attention other than SDPA or eager, or any generation setting that reads the prompt as a sequence, such as n-gram bans
or stop strings) goes to `model.generate` unchanged, as does a batch with neither a shared prefix nor a repeated
prompt.
"""

from __future__ import annotations

import inspect

import torch
from transformers import DynamicCache


# generate() settings that read each row only token by token (sampling, lengths, special ids) or that must be plain
# for one cache row per prompt row, filled before generate, to be what generate would build. A setting that reads the
# prompt's token sequence (no_repeat_ngram_size, multi-token bad words or sequence biases, stop strings, ...) would see
# the padding in the middle of a row: any setting not listed here sends the call to generate unchanged.
_SETTINGS = {
    "max_new_tokens",
    "max_length",
    "min_new_tokens",
    "do_sample",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "repetition_penalty",  # a set of the row's tokens: the same padding count whichever the layout
    "pad_token_id",
    "bos_token_id",
    "eos_token_id",
    "disable_compile",
    "output_attentions",
    "output_hidden_states",
    "transformers_version",
    "_from_model_config",
}
# ... of which these only at their plain value (unset, None, means generate's default: the plain one)
_PLAIN = {
    "num_beams": 1,
    "num_return_sequences": 1,
    "return_dict_in_generate": False,
    "use_cache": True,
    "cache_implementation": None,
    "prefill_chunk_size": None,
    "output_attentions": False,
    "output_hidden_states": False,
}


def shared_prefill_generate(model, generate, input_ids: torch.Tensor, attention_mask=None, **kwargs) -> torch.Tensor:
    """`generate(input_ids=..., attention_mask=..., **kwargs)` (the model's own `generate`, called once) with the
    shared prompt positions prefilled once. `input_ids`: left-padded prompts `(B, L)`. Returns `(B, L + new)`: the
    caller's prompt columns, then the generated tokens."""
    plan = _plan(model, input_ids, attention_mask, kwargs)
    if plan is None:
        return generate(input_ids=input_ids, attention_mask=attention_mask, **kwargs)
    prefix, rests, inverse, pad = plan
    width = input_ids.size(1)
    device = input_ids.device
    cache = _prefilled_cache(model, prefix, rests, pad, width, device)
    cache.reorder_cache(torch.tensor(inverse, device=device))  # one cache row per prompt row
    rows = [rests[i] for i in inverse]
    out = generate(
        input_ids=torch.tensor([_middle_padded(prefix, rest, pad, width) for rest in rows], device=device),
        attention_mask=torch.tensor([_middle_mask(prefix, rest, width) for rest in rows], device=device),
        cache=cache,
        **kwargs,
    )
    return torch.cat([input_ids, out[:, width:]], dim=1)


def _plan(model, input_ids, attention_mask, kwargs):
    """`(prefix, distinct rests, each row's rest index, pad id)`, or None when the call goes to generate unchanged."""
    if input_ids.dim() != 2 or model.config.is_encoder_decoder:
        return None
    if model.config.get_text_config() is not model.config:
        return None  # a composite (vision-language) model: its rope offsets are set at the first prefill
    peft_config = getattr(model, "active_peft_config", None)
    if peft_config is not None and peft_config.is_prompt_learning:
        return None  # virtual tokens and the adapter's own cache
    config = kwargs.get("generation_config") or model.generation_config
    settings = {**config.to_diff_dict(), **{k: v for k, v in kwargs.items() if k != "generation_config"}}
    if set(settings) - _SETTINGS - set(_PLAIN):
        return None
    for name, plain in _PLAIN.items():
        if settings.get(name) is not None and settings[name] != plain:
            return None
    if getattr(model.config, "_attn_implementation", None) not in ("sdpa", "eager"):
        return None  # kernels that unpad by the mask (flash attention) are not tested with padding mid-row
    if "position_ids" not in inspect.signature(_causal_lm(model).forward).parameters:
        return None  # generate would number the middle-padded positions as they lie
    cache = DynamicCache(config=model.config)
    if any(cache.is_sliding) or any(cache.is_linear) or not cache.layers:
        return None
    ids = input_ids.tolist()
    mask = [[1] * len(row) for row in ids] if attention_mask is None else attention_mask.tolist()
    prompts = []
    for row, row_mask in zip(ids, mask, strict=True):
        start = len(row_mask) - sum(row_mask)
        if any(row_mask[:start]) or not all(row_mask[start:]) or start == len(row):
            return None  # not left padding, or an empty prompt
        prompts.append(tuple(row[start:]))
    # the prefix: common to every prompt, leaving each at least its last token for generate to prefill
    shortest = min(len(p) for p in prompts)
    length = 0
    while length < shortest - 1 and all(p[length] == prompts[0][length] for p in prompts):
        length += 1
    distinct = {}
    inverse = [distinct.setdefault(p[length:], len(distinct)) for p in prompts]
    if length == 0 and (len(distinct) == len(prompts) or max(map(len, distinct)) == 1):
        return None  # nothing shared, or nothing before the last tokens to prefill
    pad = next((t for row, m in zip(ids, mask, strict=True) for t, keep in zip(row, m, strict=True) if not keep), 0)
    return list(prompts[0][:length]), [list(rest) for rest in distinct], inverse, pad


def _middle_padded(prefix, rest, pad, width):
    return prefix + [pad] * (width - len(prefix) - len(rest)) + rest


def _middle_mask(prefix, rest, width):
    return [1] * len(prefix) + [0] * (width - len(prefix) - len(rest)) + [1] * len(rest)


@torch.no_grad()
def _prefilled_cache(model, prefix, rests, pad, width, device) -> DynamicCache:
    """The cache of every column but the last, one row per distinct rest: the prefix computed once and repeated, then
    the rests (minus their last token) in one batch on top of it."""
    cache = DynamicCache(config=model.config)
    if prefix:
        model(
            input_ids=torch.tensor([prefix], device=device),
            position_ids=torch.arange(len(prefix), device=device).unsqueeze(0),
            cache=cache,
            use_cache=True,
            **_last_logits_only(model),
        )
        cache.batch_repeat_interleave(len(rests))
    if width - len(prefix) > 1:
        mask = torch.tensor([_middle_mask(prefix, rest[:-1], width - 1) for rest in rests], device=device)
        # positions as generate counts them: unmasked tokens before this one (padding: 0, never attended to)
        positions = (mask.cumsum(-1) - 1).masked_fill(mask == 0, 0)[:, len(prefix) :]
        model(
            input_ids=torch.tensor(
                [_middle_padded(prefix, rest[:-1], pad, width - 1) for rest in rests], device=device
            )[:, len(prefix) :],
            attention_mask=mask,
            position_ids=positions,
            cache=cache,
            use_cache=True,
            **_last_logits_only(model),
        )
    return cache


def _last_logits_only(model) -> dict:
    """`logits_to_keep=1` where the causal LM takes it: the prefill needs the cache, not the logits."""
    return {"logits_to_keep": 1} if "logits_to_keep" in inspect.signature(_causal_lm(model).forward).parameters else {}


def _causal_lm(model):
    """The transformers model under a PEFT wrapper (whose forward passes every keyword on)."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model
