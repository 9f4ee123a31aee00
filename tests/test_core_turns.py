"""Follow-up turns built on token ids agree with the chat template, without re-rendering earlier turns."""

import pytest

from trl_ext.core.turns import FollowUpTurn, follow_up_turn
from trl_ext.testing import tiny_tokenizer


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
        conversation + [{"role": "assistant", "content": "<answer>4</answer>"},
                        {"role": "user", "content": "How sure are you?"}],
        add_generation_prompt=True, tokenize=True, return_dict=False,
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
