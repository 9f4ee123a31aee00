"""RLCRMultiTurnTrainer on Qwen3-family chat templates, which render the last assistant turn's `<think>` block
differently from earlier ones: both turns use TRL's prefix-preserving training template, and the turn-2 prompts are
exactly the sampled context plus that template's follow-up tokens, with thinking on and off.

Two prompts, G_a = 2 answers each, G_c = 2 confidences per answer: 4 answer rows, then 8 confidence rows.
"""

import pytest
import torch
from datasets import Dataset

from trl_ext.testing import (
    QWEN3_CHAT_TEMPLATES,
    BatchRecorder,
    ScriptedGeneration,
    cpu_test_args,
    tiny_qwen3_lm,
    trl_chat_template,
)
from trl_ext.trainers import RLCRMultiTurnConfig, RLCRMultiTurnTrainer


QUESTIONS = [("What is 2+3?", "5"), ("What is 7*6?", "42")]
REASONING = {"2+3": ["add", "guess"], "7*6": ["multiply", "no idea"]}
ANSWERS = {"2+3": ["<answer>5</answer>", "<answer>6</answer>"], "7*6": ["<answer>42</answer>", "I don't know"]}
CONFIDENCES = {
    "<answer>5</answer>": ["<confidence>0.9</confidence>", "<confidence>0.6</confidence>"],
    "<answer>6</answer>": ["<confidence>0.8</confidence>", "<confidence>abc</confidence>"],
    "<answer>42</answer>": ["<confidence>1.0</confidence>", "<confidence>0.5</confidence>"],
    "I don't know": ["<confidence>0.1</confidence>", "no tags at all"],
}
CONFIDENCE_PROMPT = "How confident are you? Reply <confidence>p</confidence>."


def run_step(tmp_path, template, thinking):
    model, tokenizer = tiny_qwen3_lm(template)
    kwargs = {"enable_thinking": thinking, **({"preserve_thinking": False} if template == "qwen3_8" else {})}
    dataset = Dataset.from_list([{"prompt": [{"role": "user", "content": q}], "solution": s} for q, s in QUESTIONS])
    args = cpu_test_args(
        tmp_path,
        RLCRMultiTurnConfig,
        max_steps=1,
        per_device_train_batch_size=4,
        num_generations=2,
        num_generations_confidence=2,
        confidence_prompt=CONFIDENCE_PROMPT,
        shuffle_dataset=False,
        max_completion_length=32,
        max_confidence_length=16,
        chat_template_kwargs=kwargs,
    )
    trainer = RLCRMultiTurnTrainer(model=model, args=args, train_dataset=dataset, processing_class=tokenizer)

    def script(prompt_text, k):
        if CONFIDENCE_PROMPT in prompt_text:
            answer_turn = prompt_text.split("<|im_start|>assistant\n")[1]
            return next(replies[k] for answer, replies in CONFIDENCES.items() if answer in answer_turn)
        key = "2+3" if "2+3" in prompt_text else "7*6"
        if prompt_text.endswith("</think>\n\n"):  # thinking off: the template closed an empty block
            return ANSWERS[key][k]
        opened = "" if prompt_text.endswith("<think>\n") else "<think>\n"  # some templates open it for the model
        return f"{opened}{REASONING[key][k]}\n</think>\n\n{ANSWERS[key][k]}"

    with ScriptedGeneration(trainer, script) as gen, BatchRecorder(trainer) as rec:
        trainer.train()
    return trainer, kwargs, gen, rec.batches[0]


def expected_conversation_text(tokenizer, template, kwargs, question, reasoning, answer, prompt_text):
    """TRL's training template's rendering of the conversation up to the confidence turn's generation prompt."""
    closed = prompt_text.endswith("</think>\n\n")
    messages = [
        {"role": "user", "content": question},
        {"role": "assistant", "content": answer, "reasoning_content": "" if closed else reasoning},
        {"role": "user", "content": CONFIDENCE_PROMPT},
    ]
    return tokenizer.apply_chat_template(
        messages,
        add_generation_prompt=True,
        tokenize=False,
        **kwargs,
        chat_template=trl_chat_template(f"{template}_training"),
    )


@pytest.fixture(scope="module", params=[True, False], ids=["think", "nothink"])
def qwen3_step(request, tmp_path_factory):
    return run_step(tmp_path_factory.mktemp("qwen3"), "qwen3", request.param)


def test_qwen3_exact_batch(qwen3_step):
    trainer, kwargs, gen, batch = qwen3_step
    tok = trainer.processing_class
    thinking = kwargs["enable_thinking"]
    assert trainer.chat_template == trl_chat_template("qwen3_training")  # swapped at init, as for TRL's tool turns
    first, second = gen.calls
    assert len(first.prompt_ids) == 4 and len(second.prompt_ids) == 8

    # Turn 1: the prompt as Qwen3 renders it (its template and the training one agree on a single user turn).
    for i, (question, _) in enumerate(QUESTIONS):
        expected = tok.apply_chat_template(
            [{"role": "user", "content": question}],
            add_generation_prompt=True,
            tokenize=False,
            chat_template=trl_chat_template("qwen3"),
            **kwargs,
        )
        assert tok.decode(first.prompt_ids[2 * i]) == expected
        assert expected.endswith("<|im_start|>assistant\n" if thinking else "assistant\n<think>\n\n</think>\n\n")

    # Turn 2: exactly the sampled context, then the follow-up tokens, and that is the training template's rendering
    # of the whole conversation.
    for i, turn2 in enumerate(second.prompt_ids):
        prompt, answer = first.prompt_ids[i // 2], first.completion_ids[i // 2]
        assert turn2[: len(prompt) + len(answer)] == prompt + answer
        suffix = tok.decode(turn2[len(prompt) + len(answer) :])
        assert suffix == f"\n<|im_start|>user\n{CONFIDENCE_PROMPT}<|im_end|>\n<|im_start|>assistant\n" + (
            "" if thinking else "<think>\n\n</think>\n\n"
        )
        key = "2+3" if i < 4 else "7*6"
        question = QUESTIONS[i // 4][0]
        assert tok.decode(turn2) == expected_conversation_text(
            tok,
            "qwen3",
            kwargs,
            question,
            REASONING[key][(i // 2) % 2],
            ANSWERS[key][(i // 2) % 2],
            tok.decode(prompt),
        )
        n = int(batch["prompt_mask"][4 + i].sum())
        assert batch["prompt_ids"][4 + i, -n:].tolist() == turn2  # the batch trains on that same prompt

    # Rows, span masks and advantages, by hand.
    assert batch["row_kind"].tolist() == [0] * 4 + [1] * 8
    mask = batch["tool_mask"] * batch["completion_mask"]
    ids = first.completion_ids + second.completion_ids
    trained = [tok.decode([t for t, m in zip(row, mask[r].tolist()) if m]) for r, row in enumerate(ids)]
    think = "<think>\nadd\n</think>\n\n" if thinking else ""  # without <think> in the completion: from its start
    assert trained[0] == f"{think}<answer>5</answer><|im_end|>"
    assert trained[3] == ("<think>\nno idea\n</think>\n\n" if thinking else "") + "I don't know<|im_end|>"
    assert trained[4] == "<confidence>0.9</confidence><|im_end|>"
    std = 0.5**0.5
    answer_adv = [0.5 / (std + 1e-4), -0.5 / (std + 1e-4)] * 2  # accuracy [1, 0] for both prompts
    # Brier per answer (acc; c -> 1 - (acc - c)^2), minus the sibling mean:
    #   5 (1): .9 -> .99, .6 -> .84;  6 (0): .8 -> .36, abc -> 0;  42 (1): 1 -> 1, .5 -> .75;  ? (0): .1 -> .99, - -> 0
    confidence_adv = [0.075, -0.075, 0.18, -0.18, 0.125, -0.125, 0.495, -0.495]
    torch.testing.assert_close(batch["advantages"], torch.tensor(answer_adv + confidence_adv), rtol=0, atol=1e-5)


@pytest.mark.parametrize("template", [t for t in QWEN3_CHAT_TEMPLATES if t != "qwen3"])
@pytest.mark.parametrize("thinking", [True, False], ids=["think", "nothink"])
def test_every_qwen3_family_template_gives_prefix_consistent_turn_two(tmp_path, template, thinking):
    trainer, kwargs, gen, _ = run_step(tmp_path, template, thinking)
    tok = trainer.processing_class
    assert trainer.chat_template == trl_chat_template(f"{template}_training")
    first, second = gen.calls
    for i, turn2 in enumerate(second.prompt_ids):
        prompt, answer = first.prompt_ids[i // 2], first.completion_ids[i // 2]
        assert turn2[: len(prompt) + len(answer)] == prompt + answer
        key = "2+3" if i < 4 else "7*6"
        assert tok.decode(turn2) == expected_conversation_text(
            tok,
            template,
            kwargs,
            QUESTIONS[i // 4][0],
            REASONING[key][(i // 2) % 2],
            ANSWERS[key][(i // 2) % 2],
            tok.decode(prompt),
        )
