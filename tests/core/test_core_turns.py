"""Follow-up turns built on token ids agree with the chat template, without re-rendering earlier turns; every chat
template TRL ships a training version of is kept, swapped for that version, or refused."""

from pathlib import Path

import pytest
import trl

from trl_ext.core.turns import FollowUpTurn, NotPrefixPreservingError, follow_up_turn
from trl_ext.testing import QWEN3_CHAT_TEMPLATES, tiny_qwen3_lm, tiny_tokenizer, trl_chat_template


@pytest.fixture(scope="module")
def tok():
    return tiny_tokenizer()


def test_suffix_matches_the_template(tok):
    turn = follow_up_turn(tok, "How sure are you?", [tok.eos_token_id])
    assert turn.end_of_turn_ids == [tok.eos_token_id]
    assert tok.decode(turn.suffix_ids) == "\n<|im_start|>user\nHow sure are you?<|im_end|>\n<|im_start|>assistant\n"
    # token concatenation reproduces the template's rendering of the whole conversation
    conversation = [{"role": "user", "content": "What is 2+2?"}]
    prompt_ids = tok.apply_chat_template(conversation, add_generation_prompt=True, tokenize=True, return_dict=False)
    answer_ids = tok.encode("<answer>4</answer>", add_special_tokens=False) + [tok.eos_token_id]
    full = tok.apply_chat_template(
        conversation
        + [{"role": "assistant", "content": "<answer>4</answer>"}, {"role": "user", "content": "How sure are you?"}],
        add_generation_prompt=True,
        tokenize=True,
        return_dict=False,
    )
    assert turn.prompt_ids(prompt_ids, answer_ids, [tok.eos_token_id]) == list(full)


def test_truncated_answer_gets_an_end_of_turn_token():
    turn = FollowUpTurn(end_of_turn_ids=[2], suffix_ids=[7, 8])
    assert turn.prompt_ids([1, 1], [5, 6], eos_token_ids=[2]) == [1, 1, 5, 6, 2, 7, 8]  # truncated: close the turn
    assert turn.prompt_ids([1, 1], [5, 2], eos_token_ids=[2]) == [1, 1, 5, 2, 7, 8]  # finished: no second EOS
    assert turn.prompt_ids([1], [], eos_token_ids=[2]) == [1, 2, 7, 8]


def test_template_that_rewrites_earlier_turns_is_not_re_rendered(tok):
    """A template that strips <think> from earlier assistant turns: the answer keeps its sampled tokens."""
    stripping = (
        "{% for m in messages %}<|im_start|>{{ m.role }}\n"
        "{% if m.role == 'assistant' %}{{ m.content.split('</think>')[-1] }}{% else %}{{ m.content }}{% endif %}"
        "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    turn = follow_up_turn(tok, "Confidence?", [tok.eos_token_id], chat_template=stripping)
    answer_ids = tok.encode("<think>hmm</think><answer>4</answer>", add_special_tokens=False) + [tok.eos_token_id]
    ids = turn.prompt_ids([9], answer_ids, [tok.eos_token_id])
    assert ids[1 : 1 + len(answer_ids)] == answer_ids  # the <think> part the model sampled is still there


def test_template_without_eos_is_rejected(tok):
    no_eos = "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}"
    with pytest.raises(ValueError, match="end-of-sequence token"):
        follow_up_turn(tok, "Confidence?", [tok.eos_token_id], chat_template=no_eos)


def test_an_eos_before_the_answer_does_not_close_it():
    """GLM-4.5 ends a turn with the next role tag (`<|user|>` is one of its EOS ids) and writes nothing after an
    assistant message: the only EOS in the rendering opens the question, and cutting there made a suffix that repeated
    the whole first turn."""
    tok = tiny_tokenizer()
    tok.chat_template = trl_chat_template("glm4moe")
    tok.add_special_tokens({"additional_special_tokens": ["<|user|>", "<|assistant|>"]})
    eos = [tok.eos_token_id, tok.convert_tokens_to_ids("<|user|>")]
    with pytest.raises(ValueError, match="closes an assistant turn without an end-of-sequence token"):
        follow_up_turn(tok, "Confidence?", eos)


# -- templates that render the last assistant turn differently: TRL's prefix-preserving training versions ---------
def _qwen_cases():
    for name in QWEN3_CHAT_TEMPLATES:
        for thinking in (True, False):
            kwargs = {"enable_thinking": thinking}
            if name == "qwen3_8":  # prefix-preserving as shipped (preserve_thinking defaults on); not without it
                kwargs["preserve_thinking"] = False
            yield pytest.param(name, kwargs, id=f"{name}-{'think' if thinking else 'nothink'}")


@pytest.mark.parametrize("name, kwargs", list(_qwen_cases()))
def test_qwen3_family_templates_use_trls_training_version(name, kwargs):
    """The template as shipped is refused; the tokenizer's own gets TRL's training version, and token concatenation
    of a sampled answer then renders exactly as that template renders the whole conversation."""
    _, tok = tiny_qwen3_lm(name)
    eos = [tok.eos_token_id]
    with pytest.raises(NotPrefixPreservingError, match="renders the first turns differently"):
        follow_up_turn(tok, "Confidence?", eos, chat_template=trl_chat_template(name), **kwargs)

    turn = follow_up_turn(tok, "Confidence?", eos, **kwargs)
    training = trl_chat_template(f"{name}_training")
    assert turn.chat_template == training

    question = [{"role": "user", "content": "What is 2+3?"}]
    prompt_ids = tok.apply_chat_template(
        question,
        add_generation_prompt=True,
        tokenize=True,
        return_dict=False,
        chat_template=turn.chat_template,
        **kwargs,
    )
    prompt_text = tok.decode(prompt_ids)
    opened = prompt_text.endswith("<think>\n")  # generation prompts that open the reasoning block for the model
    closed = prompt_text.endswith("</think>\n\n")  # thinking off: an empty block, closed
    reasoning = ("" if opened else "<think>\n") + "add\n</think>\n\n"
    sampled = "<answer>5</answer>" if closed else reasoning + "<answer>5</answer>"
    answer_ids = tok.encode(sampled, add_special_tokens=False) + eos
    ids = turn.prompt_ids(prompt_ids, answer_ids, eos)
    assert ids[: len(prompt_ids) + len(answer_ids)] == list(prompt_ids) + answer_ids

    # the answer as a message, its reasoning apart (as TRL's response parsing gives it)
    answer = {"role": "assistant", "content": "<answer>5</answer>", "reasoning_content": "" if closed else "add"}
    conversation = question + [answer, {"role": "user", "content": "Confidence?"}]
    rendered = tok.apply_chat_template(
        conversation, add_generation_prompt=True, tokenize=False, chat_template=training, **kwargs
    )
    assert tok.decode(ids) == rendered
    # the shipped template would re-render the answer's turn differently: that is why it is refused
    shipped = tok.apply_chat_template(
        conversation, add_generation_prompt=True, tokenize=False, chat_template=trl_chat_template(name), **kwargs
    )
    assert shipped != rendered


# -- every chat template TRL ships a training version of -------------------------------------------------------------
TRAINING_TEMPLATES = sorted(
    p.name.removesuffix("_training.jinja")
    for p in (Path(trl.__file__).parent / "chat_templates").glob("*_training.jinja")
)
# The token each template's models end an assistant turn with (an EOS id), and, where it differs, the tokenizer's
# EOS, which TRL also counts as one (Phi-3's template writes it after the last turn only).
END_OF_TURN = {
    "cohere": "<|END_OF_TURN_TOKEN|>",
    "cohere2": "<|END_OF_TURN_TOKEN|>",
    "deepseek_r1_distill": "<｜end▁of▁sentence｜>",
    "deepseekv3": "<｜end▁of▁sentence｜>",
    "diffusion_gemma": "<turn|>",
    "gemma": "<end_of_turn>",
    "gemma3": "<end_of_turn>",
    "glm4moe": "<|user|>",
    "gptoss": "<|return|>",
    "lfm2": "<|im_end|>",
    "lfm2_v2": "<|im_end|>",
    "llama3": "<|eot_id|>",
    "muse_glimmer": "<|eot|>",
    "nemotron_3_nano": "<|im_end|>",
    "nemotron_3_super": "<|im_end|>",
    "nemotron_3_ultra": "<|im_end|>",
    "nemotron_3_5_lightning": "<|im_end|>",
    "phi3": "<|end|>",
    "phi3_5": "<|end|>",
    "qwen2_5": "<|im_end|>",
    "qwen2_5_vl": "<|im_end|>",
    "qwen3": "<|im_end|>",
    "qwen3_instruct_2507": "<|im_end|>",
    "qwen3_vl": "<|im_end|>",
    "qwen3_5_nothink": "<|im_end|>",
    "qwen3_5_think": "<|im_end|>",
    "qwen3_6": "<|im_end|>",
    "qwen3_8": "<|im_end|>",
}
TOKENIZER_EOS = {"glm4moe": "<|endoftext|>", "phi3": "<|endoftext|>", "phi3_5": "<|endoftext|>"}
# Swapped for TRL's training version (`qwen3_8` only with preserve_thinking=False, tested above).
SWAPPED = set(QWEN3_CHAT_TEMPLATES) - {"qwen3_8"}
# Refused at init, TRL's training version notwithstanding: gpt-oss closes the last assistant turn with <|return|>
# and earlier ones with <|end|>, Phi-3 writes its EOS after the last turn only (their training versions only add
# generation markers); GLM-4.5 writes no end-of-turn token after an assistant message.
REFUSED = {
    "gptoss": "renders the first turns differently",
    "phi3": "renders the first turns differently",
    "phi3_5": "renders the first turns differently",
    "glm4moe": "without an end-of-sequence token",
}
# Vision-language processors' templates, which read message content as a list of parts: not covered here.
VISION = {"idefics3", "llava_next", "smolvlm"}
# Generation prompts that the rendered history does not start the answer turn with (the `<think>` they open is
# dropped): the follow-up keeps the sampled tokens, which the template re-renders otherwise.
REWRITES_ANSWER_TURN = {"deepseek_r1_distill", "deepseekv3"}


def carrying(name):
    """SmolLM2's tokenizer with TRL's stored template `name`, its end-of-turn token a special token; and the EOS ids
    as GRPOTrainer collects them (the tokenizer's EOS and the model's)."""
    tok = tiny_tokenizer()
    tok.chat_template = trl_chat_template(name)
    tok.add_special_tokens({"additional_special_tokens": [END_OF_TURN[name]]})
    tok.eos_token = TOKENIZER_EOS.get(name, END_OF_TURN[name])
    return tok, sorted({tok.eos_token_id, tok.convert_tokens_to_ids(END_OF_TURN[name])})


def _template_cases():
    for name in TRAINING_TEMPLATES:
        for thinking in (True, False):
            skip = pytest.mark.skip(reason="vision-language template: content is a list of parts")
            yield pytest.param(
                name,
                thinking,
                id=f"{name}-{'think' if thinking else 'nothink'}",
                marks=[skip] if name in VISION else [],
            )


@pytest.mark.parametrize("name, thinking", list(_template_cases()))
def test_every_template_trl_has_a_training_version_of(name, thinking):
    """Kept when prefix-preserving as shipped (TRL's version only adds generation markers and renders the same),
    swapped for TRL's version (the Qwen3 family), or refused with the fix."""
    tok, eos = carrying(name)
    kwargs = {"enable_thinking": thinking}
    if name in REFUSED:
        with pytest.raises(ValueError, match=rf"{REFUSED[name]}.*[Ss]et `tokenizer\.chat_template`"):
            follow_up_turn(tok, "Confidence?", eos, **kwargs)
        return
    turn = follow_up_turn(tok, "Confidence?", eos, **kwargs)
    training = trl_chat_template(f"{name}_training")
    assert turn.chat_template == (training if name in SWAPPED else None)
    conversation = [
        {"role": "user", "content": "What is 2+3?"},
        {"role": "assistant", "content": "<answer>5</answer>"},
        {"role": "user", "content": "Confidence?"},
    ]
    render = {
        template: tok.apply_chat_template(
            conversation, add_generation_prompt=True, tokenize=False, chat_template=template, **kwargs
        )
        for template in (training, trl_chat_template(name))
    }
    assert (render[training] != render[trl_chat_template(name)]) == (name in SWAPPED)


@pytest.mark.parametrize("name", sorted(set(TRAINING_TEMPLATES) - SWAPPED - set(REFUSED) - VISION))
def test_kept_templates_render_the_follow_up_exactly(name):
    """Thinking off, the answer sampled as the template renders it: token concatenation gives the template's own
    rendering of the whole conversation (as for the Qwen3 family with TRL's version, above)."""
    tok, eos = carrying(name)
    turn = follow_up_turn(tok, "Confidence?", eos, enable_thinking=False)
    question = [{"role": "user", "content": "What is 2+3?"}]
    answer = {"role": "assistant", "content": "<answer>5</answer>"}

    def render(messages, add_generation_prompt):
        return tok.apply_chat_template(
            messages, add_generation_prompt=add_generation_prompt, tokenize=False, enable_thinking=False
        )

    prompt, closed = render(question, True), render([*question, answer], False)
    assert closed.startswith(prompt) != (name in REWRITES_ANSWER_TURN)
    if name in REWRITES_ANSWER_TURN:
        return  # the sampled tokens are kept, as test_template_that_rewrites_earlier_turns_is_not_re_rendered shows
    sampled = closed[len(prompt) :].split(END_OF_TURN[name])[0]
    prompt_ids = tok(prompt, add_special_tokens=False)["input_ids"]
    answer_ids = tok(sampled, add_special_tokens=False)["input_ids"] + [tok.convert_tokens_to_ids(END_OF_TURN[name])]
    ids = turn.prompt_ids(prompt_ids, answer_ids, eos)
    assert tok.decode(ids) == render([*question, answer, {"role": "user", "content": "Confidence?"}], True)


def test_prefix_preserving_template_is_kept(tok):
    turn = follow_up_turn(tok, "Confidence?", [tok.eos_token_id])
    assert turn.chat_template is None  # SmolLM2's own ChatML template
    tok = tiny_tokenizer()
    tok.chat_template = trl_chat_template("qwen2_5")
    assert follow_up_turn(tok, "Confidence?", [tok.eos_token_id]).chat_template is None


def test_template_without_a_training_version_is_refused_with_the_fix(tok):
    tok = tiny_tokenizer()
    # renders the last assistant turn with a marker it drops once another message follows; TRL does not know it
    tok.chat_template = (
        "{% for m in messages %}<|im_start|>{{ m.role }}\n{% if m.role == 'assistant' and loop.last %}[last] "
        "{% endif %}{{ m.content }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n"
        "{% endif %}"
    )
    with pytest.raises(
        ValueError,
        match=r"TRL ships no prefix-preserving training version of it\. Set "
        r"`tokenizer.chat_template`",
    ):
        follow_up_turn(tok, "Confidence?", [tok.eos_token_id])
