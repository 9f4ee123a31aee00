"""vLLM colocate mode (`vllm_colocate_mode`: TRL's real `VLLMGeneration` over a stand-in engine that enforces
sleep mode): every trainer pushes its weights once per optimizer step, whatever the number of generate calls per
step (RLCR's two turns, Absolute Zero's rounds, the held-out evaluation's chunks), with evaluation during training.
The trainers and scripts are tests/scripts/heldout_ranks.py's."""

from pathlib import Path

import pytest
import torch

from trl_ext.testing import changed_parameters, load_script, snapshot_parameters, tiny_causal_lm
from trl_ext.testing.vllm_colocate import vllm_colocate_mode


scenario = load_script(Path(__file__).parents[1] / "scripts" / "heldout_ranks.py")


def absolute_zero_script(prompt_text, k):
    """Valid proposals (the seed prompts), then the held-out replies, or answers right for half the samples."""
    if "Seed " in prompt_text.split("<|im_start|>user")[-1]:
        return f"<question>{k + 1} + 2</question>"
    if any(q["expression"] in prompt_text for q in scenario.SOLVER_QUESTIONS):
        return scenario.solver_script(prompt_text, k)
    return f"<answer>{3 + k % 2}</answer>"  # the questions are k + 3 for k = 0, 1


TRAINERS = {  # builder, script, training overrides
    "rlcr": (scenario.rlcr_trainer, scenario.rlcr_script, {}),
    "replay": (scenario.replay_trainer, scenario.replay_script, {}),
    "absolute_zero": (scenario.absolute_zero_trainer, absolute_zero_script, {"per_device_train_batch_size": 4}),
}


def train_colocated(name, sleep_mode):
    build, script, overrides = TRAINERS[name]
    model, tokenizer = tiny_causal_lm()
    with vllm_colocate_mode(model, tokenizer, script=script) as engines:
        trainer, _ = build(
            max_steps=2,
            learning_rate=0.05,
            eval_strategy="steps",
            eval_steps=1,
            use_vllm=True,
            vllm_mode="colocate",
            vllm_enable_sleep_mode=sleep_mode,
            **overrides,
        )
        (engine,) = engines
        pushed_at = []
        sync_weights = trainer.vllm_generation.sync_weights

        def recorded_sync():
            pushed_at.append(trainer.state.global_step)
            sync_weights()

        trainer.vllm_generation.sync_weights = recorded_sync
        before = snapshot_parameters(trainer.model)
        trainer.train()
    assert changed_parameters(before, trainer.model)  # the pushes carry new weights
    return trainer, engine, pushed_at


# without sleep mode TRL's own step check pushes once per step: checked once, for RLCR
CASES = [(name, True) for name in TRAINERS] + [("rlcr", False)]


@pytest.mark.slow  # two training steps and two evaluations per case
@pytest.mark.parametrize(("name", "sleep_mode"), CASES, ids=[f"{n}-{'sleep' if s else 'awake'}" for n, s in CASES])
def test_one_push_per_step_with_evaluation(name, sleep_mode):
    trainer, engine, pushed_at = train_colocated(name, sleep_mode)
    # Steps 0 and 1 train; evaluations run after each optimizer step, at steps 1 and 2. The evaluation at step 1
    # pushes, and training at step 1 generates with those weights.
    assert pushed_at == [0, 1, 2]
    assert engine.pushes == 3
    generates = [event for event in engine.events if event[0] == "generate"]
    assert len(generates) > 2 * engine.pushes  # several generate calls share each push
    evaluations = [log for log in trainer.state.log_history if any(key.startswith("eval_") for key in log)]
    assert len(evaluations) == 2
    # The engine holds the final weights: the last evaluation generated with them.
    for name_, param in trainer.model.named_parameters():
        torch.testing.assert_close(dict(engine.model.named_parameters())[name_], param.detach(), msg=name_)
    if sleep_mode:
        # Asleep for every loss and optimizer step: one sleep per training batch, after its generate calls.
        sleeps = [i for i, event in enumerate(engine.events) if event[0] == "sleep"]
        assert len(sleeps) == 1 + 2  # at init, then once per training batch
        assert all(engine.events[i] == ("sleep", 2) for i in sleeps)
