"""ReplayGRPOTrainer with scripted generation: the exact replay batch."""

import pytest
import torch
from scripts.replay_world import SOLUTIONS, PlanRecorder, make_trainer, scripted, task_of

from trl_ext.testing import BatchRecorder


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    trainer = make_trainer(tmp_path_factory.mktemp("replay"))
    with scripted(trainer) as gen, BatchRecorder(trainer) as rec, PlanRecorder(trainer) as plans:
        trainer.train()
    return trainer, gen.calls, rec.batches, plans.plans


def replay_groups(plan, n=4):
    return [g for g in range(len(plan.group_tasks)) if any(plan.global_stored[g * n : (g + 1) * n])]


def texts(trainer, ids, mask):
    return [trainer.processing_class.decode(row[m.bool()], skip_special_tokens=True) for row, m in zip(ids, mask)]


def group_task_names(plan, n=4):
    return [task_of(x["prompt"][0]["content"]) for x in plan.local_inputs[::n]]


def test_first_batch_is_plain_grpo_and_fills_the_buffer(run):
    trainer, calls, batches, plans = run
    assert calls[0].num_generations == 4 and len(calls[0].prompt_ids) == 8
    assert "exp_mask" not in batches[0] and not plans[0].has_replay
    assert group_task_names(plans[0]) == ["A", "B"]
    # A (2 of 4 right) is in the collection window 0 < 2 < 4, B (none right) is not: one stored trajectory.
    assert trainer.state.log_history[1]["replay/buffer_trajectories"] == 1  # logged when step 1 is planned


def test_replay_group_holds_fresh_rows_and_the_stored_trajectory(run):
    trainer, calls, batches, plans = run
    plan, batch, call = plans[1], batches[1], calls[1]
    assert replay_groups(plan) != []
    (g,) = replay_groups(plan)
    # One sample per row, only the fresh rows: 4 + 3 instead of 8.
    assert call.num_generations == 1 and len(call.prompt_ids) == 7
    stored_row = g * 4 + 3
    trajectory = plan.stored[stored_row]
    assert trajectory is not None and all(s is None for i, s in enumerate(plan.stored) if i != stored_row)
    length = trajectory.num_tokens
    assert batch["completion_ids"][stored_row, :length].tolist() == trajectory.completion_ids.tolist()
    assert batch["completion_mask"][stored_row].sum().item() == length
    # exp_mask marks exactly the stored row's completion tokens.
    expected_mask = torch.zeros_like(batch["exp_mask"])
    expected_mask[stored_row, :length] = 1
    assert torch.equal(batch["exp_mask"], expected_mask)
    # old_per_token_logps holds the log-probs recorded at collection on that row.
    assert torch.equal(batch["old_per_token_logps"][stored_row, :length], trajectory.logps)
    # TRL computed no old log-probs for this batch (aligned steps, no vLLM): the batch says so.
    assert batch["replay_has_old_logps"].item() is False
    assert trajectory.policy_version == 0
    # The replayed task is the one collected at step 0 (A); all rows of the group carry its prompt.
    prompts = texts(trainer, batch["prompt_ids"], batch["prompt_mask"])
    assert {task_of(p) for p in prompts[g * 4 : g * 4 + 4]} == {"A"}
    assert batch["prompt_ids"][stored_row].tolist() == batch["prompt_ids"][g * 4].tolist()


def test_stored_rows_are_rescored_and_advantages_are_in_group(run):
    trainer, _, batches, plans = run
    plan, batch = plans[1], batches[1]
    completions = texts(trainer, batch["completion_ids"], batch["completion_mask"])
    prompts = texts(trainer, batch["prompt_ids"], batch["prompt_mask"])
    rewards = torch.tensor([float(c.strip() == SOLUTIONS[task_of(p)]) for c, p in zip(completions, prompts)])
    (g,) = replay_groups(plan)
    assert rewards[g * 4 + 3] == 1.0  # the stored success, scored again by the current reward function
    for group in range(2):
        r = rewards[group * 4 : group * 4 + 4]
        expected = (r - r.mean()) / (r.std() + 1e-4)
        assert batch["advantages"][group * 4 : group * 4 + 4] == pytest.approx(expected.tolist(), abs=1e-5)
    assert batch["advantages"][g * 4 : g * 4 + 4].abs().sum() > 0  # the replayed group trains


def test_fewer_tokens_are_generated_in_replay_batches(run):
    trainer, calls, batches, plans = run
    generated = [sum(len(c) for c in call.completion_ids) for call in calls]
    for call, plan, batch in zip(calls, plans, batches):
        rows = 8 - len(replay_groups(plan))  # k = 1 stored row per replay group
        assert len(call.completion_ids) == rows
        fresh = torch.tensor([s is None for s in plan.stored])
        assert sum(len(c) for c in call.completion_ids) == batch["completion_mask"][fresh].sum().item()
    logged = [h["replay/fresh_tokens"] for h in trainer.state.log_history if "replay/fresh_tokens" in h]
    assert logged == generated
    assert any(plan.has_replay for plan in plans[1:])


def test_retired_task_is_not_trained_as_an_ordinary_prompt(run):
    trainer, calls, _, plans = run
    # Step 1 has C and D; D succeeds in all 4 rollouts wherever it is a fresh group and is retired from then on.
    seen = [i for i, plan in enumerate(plans) if "D" in group_task_names(plan)]
    assert seen == [1], "D reaches generation once; afterwards its group is replaced"
    decoded = [[task_of(trainer.processing_class.decode(ids)) for ids in call.prompt_ids] for call in calls]
    assert "D" in decoded[1] and all("D" not in tasks for tasks in decoded[2:])
    assert plans[3].retired_replaced == 1  # step 3 again draws C and D from the dataset
    assert trainer.state.log_history[2]["replay/num_retired"] == 1  # the buffer step 2 is planned from


def test_collection_reuses_the_loss_forward_before_replay(tmp_path):
    # Aligned steps without vLLM: TRL computes no old log-probs, and collecting needs no forward pass of its own.
    trainer = make_trainer(tmp_path, max_steps=2, replay_start_ratio=1.0)
    forwards = []
    original = trainer._get_per_token_logps_and_entropies

    def counted(*args, **kwargs):
        result = original(*args, **kwargs)
        forwards.append(result[0].detach().clone())
        return result

    trainer._get_per_token_logps_and_entropies = counted
    with scripted(trainer), BatchRecorder(trainer) as rec:
        trainer.train()
    assert len(forwards) == 2  # one loss forward per step, nothing else
    # A (step 0) and C (step 1, collected when training ended) carry exactly the log-probs of their step's loss
    # forward, under the weights that generated them.
    stored = [t for ts in trainer.experience.task2trajectories.values() for t in ts]
    assert sorted(t.policy_version for t in stored) == [0, 1]
    for trajectory in stored:
        step = trajectory.policy_version
        assert any(
            row[: trajectory.num_tokens].tolist() == trajectory.completion_ids.tolist()
            for row in rec.batches[step]["completion_ids"]
        )
        # the loss forward saw the rows shuffled: the trajectory's row is one of them
        loss_rows = forwards[step][:, : trajectory.num_tokens]
        assert any(torch.equal(trajectory.logps, row) for row in loss_rows)
