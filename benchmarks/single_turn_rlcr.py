"""Single-turn RLCR (Damani et al.) on TRL's GRPOTrainer, the calibration benchmark's baseline: answer and confidence
in one completion, reward accuracy + Brier, and the KL anchor on the answer only, as the multi-turn run places it."""

from __future__ import annotations

import torch
from trl import GRPOTrainer

from trl_ext.core.tail_spans import tail_token_mask
from trl_ext.evaluation.calibration import brier_score, expected_calibration_error
from trl_ext.rewards import extract_confidence, make_accuracy_reward
from trl_ext.rewards.parsing import completion_text
from trl_ext.trainers.seams.policy_reference import PolicyReference


TAIL_KEY = "kl_free_mask"  # the batch's per-token mask of the tokens after the answer


def single_turn_rlcr_reward():
    """Single-turn RLCR: accuracy + Brier on the same completion; logs batch ECE/Brier."""
    accuracy = make_accuracy_reward()

    def rlcr_single_turn(prompts, completions, completion_ids=None, log_metric=None, **kwargs):
        acc = accuracy(prompts, completions, completion_ids, **kwargs)
        confs = [extract_confidence(completion_text(c), "confidence") for c in completions]
        rewards = [a + (1 - (a - c) ** 2 if c is not None else 0.0) for a, c in zip(acc, confs)]
        pairs = [(c, a) for c, a in zip(confs, acc) if c is not None]
        if log_metric is not None:
            log_metric("confidence/parse_fail_rate", 1 - len(pairs) / len(confs))
            if pairs:
                log_metric("calibration/ece", expected_calibration_error(*zip(*pairs)))
                log_metric("calibration/brier", brier_score(*zip(*pairs)))
        return rewards

    return rlcr_single_turn


def single_turn_twins(confidence_turns, system_prompt: str) -> list[dict]:
    """Single-turn SFT examples stating what multi-turn `confidence_turns` state: each one's question under
    `system_prompt`, completed by the answer its prompt carries followed by its stated confidence, in one reply (the
    format warm-up's single-turn examples, `rlcr_format_examples`, write it so)."""
    twins = []
    for example in confidence_turns:
        *question, answer, _ = example["prompt"]  # the question's messages, the model's answer, the confidence prompt
        reply = answer["content"] + example["completion"][0]["content"]
        twins.append(
            {
                "prompt": [
                    {"role": "system", "content": system_prompt},
                    *(m for m in question if m["role"] != "system"),
                ],
                "completion": [{"role": "assistant", "content": reply}],
            }
        )
    return twins


class AnswerKLGRPOTrainer(GRPOTrainer):
    """GRPOTrainer whose KL term covers each completion only through the last `answer_end` (`</answer>`): the
    confidence that follows it in a single-turn RLCR reply has none, as multi-turn RLCR's confidence rows have none
    with `confidence_beta=0`. A completion without `answer_end` keeps the KL on every token.

    The batch carries the tail's token mask (`kl_free_mask`, from the completion ids); in the loss forward those
    tokens' reference log-probs become the policy's own (detached), so TRL's k3 KL there is exactly 0, with a zero
    gradient, and every other term of TRL's loss is unchanged.
    """

    def __init__(self, *args, answer_end: str = "</answer>", **kwargs):
        super().__init__(*args, **kwargs)
        self.answer_end = answer_end
        self._policy_reference = PolicyReference()

    def _generate_and_score_completions(self, inputs):
        output = super()._generate_and_score_completions(inputs)
        if self.beta != 0.0:
            ids, mask = output["completion_ids"], output["completion_mask"]
            tail = torch.zeros_like(mask)
            for row, (row_ids, length) in enumerate(zip(ids.tolist(), mask.sum(1).tolist())):
                tail[row, :length] = torch.tensor(tail_token_mask(self._tokenizer, row_ids[:length], self.answer_end))
            output[TAIL_KEY] = tail
        return output

    def _compute_loss(self, model, inputs):
        tail = inputs[TAIL_KEY].bool() if TAIL_KEY in inputs else None
        with self._policy_reference.in_loss(inputs, tail) as inputs:
            return super()._compute_loss(model, inputs)

    def _get_per_token_logps_and_entropies(self, *args, **kwargs):
        logps, entropies, aux_loss = super()._get_per_token_logps_and_entropies(*args, **kwargs)
        self._policy_reference.fill(logps)  # the loss's policy forward (a no-op outside the loss)
        return logps, entropies, aux_loss
