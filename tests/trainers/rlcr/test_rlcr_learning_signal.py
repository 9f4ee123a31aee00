"""The confidence turn learns what the answer shows, on a tiny model where no scale limit excuses a failure.

The answers are scripted: a digit written 12 times (a cue a 2-layer random model can attend to), right exactly when
it is even. The confidence turn is the tiny model's own samples, one token restricted to "0" or "1" (read as a
confidence of 0 or 1). The right confidence is a function of the answer in the turn-2 prompt, so a trainer whose
advantages, masks, packed forward or log-probs are wrong fails to learn it. Single-turn RLCR on plain GRPOTrainer,
with the answer in the prompt and the same Brier reward, is the control, at the same settings.
"""

import random
import statistics

import pytest
from datasets import Dataset
from trl import GRPOConfig, GRPOTrainer

from trl_ext.evaluation.calibration import auroc
from trl_ext.models.logprob_tiles import cpu_logprob_tiles
from trl_ext.rewards import completion_text, extract_confidence, make_brier_reward
from trl_ext.testing import ScriptedGeneration, cpu_test_args, tiny_causal_lm
from trl_ext.trainers import RLCRMultiTurnConfig, RLCRMultiTurnTrainer


PROMPT = "Say a digit."
CONFIDENCE_PROMPT = "Is it right?"
STEPS = 40
TAIL = 8  # steps whose training-batch AUROC is averaged
REPEAT = 12
SETTINGS = dict(max_steps=STEPS, learning_rate=3e-3, lr_scheduler_type="constant", temperature=1.0)


def even_is_right(gold, prediction):
    return prediction.strip().isdigit() and int(prediction[-1]) % 2 == 0


def only_zero_or_one(tokenizer):
    """`suppress_tokens` for every token but "0" and "1": the confidence is one of the two, no format to learn."""
    keep = {tokenizer.convert_tokens_to_ids("0"), tokenizer.convert_tokens_to_ids("1")}
    return [token for token in range(len(tokenizer)) if token not in keep]


def logged_aurocs(trainer):
    aurocs = [log["calibration/auroc"] for log in trainer.state.log_history if "calibration/auroc" in log]
    assert len(aurocs) >= STEPS - 2, aurocs  # both classes in (almost) every batch
    return aurocs


@pytest.mark.slow
@pytest.mark.parametrize("share_prefix, scale", [(True, "none"), (False, "none"), (True, "batch")])
def test_multi_turn_learns_confidence_from_the_answer(tmp_path, share_prefix, scale):
    model, tokenizer = tiny_causal_lm(seed=0, hidden_size=32)
    rng = random.Random(0)

    def script(prompt_text, k):
        if CONFIDENCE_PROMPT in prompt_text:
            return None  # the confidence turn: the model samples
        return f"<answer>{str(rng.randrange(10)) * REPEAT}</answer>"

    # 4 prompts x 2 answers x 4 confidences: 8 answers and 32 confidences per step
    args = cpu_test_args(
        tmp_path,
        RLCRMultiTurnConfig,
        per_device_train_batch_size=8,
        num_generations=2,
        num_generations_confidence=4,
        max_completion_length=24,
        max_confidence_length=1,
        confidence_prompt=CONFIDENCE_PROMPT,
        lenient_parsing=True,
        share_prefix=share_prefix,
        confidence_scale_rewards=scale,
        confidence_generation_kwargs={"suppress_tokens": only_zero_or_one(tokenizer)},
        **SETTINGS,
    )
    dataset = Dataset.from_list([{"prompt": [{"role": "user", "content": PROMPT}], "solution": "0"}] * 64)
    trainer = RLCRMultiTurnTrainer(
        model=model, args=args, train_dataset=dataset, processing_class=tokenizer, accuracy_func=even_is_right
    )
    with ScriptedGeneration(trainer, script):
        trainer.train()

    aurocs = logged_aurocs(trainer)
    assert statistics.mean(aurocs[:TAIL]) < 0.75, aurocs  # it starts near chance: the test measures learning
    assert statistics.mean(aurocs[-TAIL:]) >= 0.9, aurocs


@pytest.mark.slow
def test_single_turn_control_learns_the_same_signal(tmp_path):
    """Plain GRPO, the answer given in the prompt, the same one-token confidence and Brier reward."""
    model, tokenizer = tiny_causal_lm(seed=0, hidden_size=32)
    rows = []
    for digit in random.Random(0).choices(range(10), k=8 * STEPS):
        content = f"<answer>{str(digit) * REPEAT}</answer> {CONFIDENCE_PROMPT}"
        rows.append({"prompt": [{"role": "user", "content": content}], "answer_correct": float(digit % 2 == 0)})
    brier, pairs = make_brier_reward("confidence", "answer_correct", lenient=True), []

    def recorded_brier(prompts, completions, answer_correct, **kwargs):
        stated = [extract_confidence(completion_text(c), "confidence", lenient=True) for c in completions]
        pairs.append([(c, label) for c, label in zip(stated, answer_correct, strict=True) if c is not None])
        return brier(prompts, completions, answer_correct=answer_correct, **kwargs)

    # 8 answers x 4 confidences per step, as above
    args = cpu_test_args(
        tmp_path,
        GRPOConfig,
        per_device_train_batch_size=32,
        num_generations=4,
        max_completion_length=1,
        generation_kwargs={"suppress_tokens": only_zero_or_one(tokenizer)},
        **SETTINGS,
    )
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=[recorded_brier],
        args=args,
        train_dataset=Dataset.from_list(rows),
        processing_class=tokenizer,
    )
    # the CPU log-prob path the trainers use (same values, a fraction of the time)
    with cpu_logprob_tiles(RLCRMultiTurnConfig.cpu_logprob_tile_tokens, trainer.accelerator.device):
        trainer.train()
    aurocs = [a for step in pairs if (a := auroc([c for c, _ in step], [y for _, y in step])) is not None]
    assert len(aurocs) >= STEPS - 2, aurocs
    assert statistics.mean(aurocs[:TAIL]) < 0.75, aurocs
    assert statistics.mean(aurocs[-TAIL:]) >= 0.9, aurocs
