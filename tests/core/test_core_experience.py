"""ExperienceManager: buckets, retirement, selection, caps, budget, age filter, persistence."""

import io
from collections import Counter

import pytest
import torch

from trl_ext.core.experience import (
    ExperienceManager,
    GroupOutcome,
    Trajectory,
    masked_mean_entropy,
    success_bucket,
    task_id_of,
)


def traj(task, entropy, length=3, version=0, reward=1.0):
    return Trajectory(task, torch.arange(length), torch.full((length,), -0.5), reward, entropy, version)


def entropies(manager, task):
    return sorted(t.entropy for t in manager.task2trajectories[task])


def test_bucket_follows_the_latest_success_count_and_each_task_lives_in_one_bucket():
    m = ExperienceManager(num_generations=4)
    m.observe("a", 1, 4)
    m.observe("b", 1, 4)
    assert m.bucket_histogram() == {1: 2}
    m.observe("a", 3, 4)
    assert m.task2bucket == {"a": 3, "b": 1}
    assert m.bucket_histogram() == {1: 1, 3: 1}
    m.observe("b", 3, 4)
    assert m.bucket_histogram() == {3: 2}  # the emptied bucket is gone


def test_partial_groups_are_rescaled_to_the_full_group():
    assert success_bucket(2, 4, 4) == 2
    assert success_bucket(2, 3, 4) == 3  # 2.67 rounds up
    assert success_bucket(1, 3, 4) == 1  # 1.33 rounds down
    assert success_bucket(1, 2, 4) == 2  # half up


def test_retire_when_every_rollout_succeeds_and_return_when_failed_again():
    m = ExperienceManager(num_generations=4)
    m.update([GroupOutcome("a", 2, 4, [traj("a", 0.3)], torch.tensor([5, 6]), {"prompt": "p"})], step=0)
    assert m.num_trajectories == 1
    m.observe("a", 4, 4)
    assert list(m.retired) == ["a"]
    assert "a" not in m.task2bucket and "a" not in m.task2trajectories and "a" not in m.task_examples
    assert m.bucket_histogram() == {}
    m.observe("a", 1, 4)
    assert list(m.retired) == [] and m.task2bucket == {"a": 1}


def test_a_group_without_judged_rollouts_leaves_its_task_alone():
    # No gold answer: 0 successes out of 0 judged rollouts must not read as "solved every time" (retired).
    m = ExperienceManager(num_generations=4)
    m.update([GroupOutcome("a", 2, 4, [traj("a", 0.3)])], step=0)
    m.update([GroupOutcome("a", 0, 0), GroupOutcome("b", 0, 0)], step=1)
    assert m.task2bucket == {"a": 2} and m.retired == {} and m.num_trajectories == 1
    assert not m.collects(0, 0)


def test_collection_window_is_strict_on_both_bounds():
    m = ExperienceManager(num_generations=4, experience_lbound=1, experience_rbound=3)
    outcomes = [GroupOutcome(t, s, 4, [traj(t, 0.1)]) for t, s in [("one", 1), ("two", 2), ("three", 3)]]
    m.update(outcomes, step=0)
    assert list(m.task2trajectories) == ["two"]


@pytest.mark.parametrize("mode, kept", [("argmin", 0.2), ("argmax", 0.9)])
def test_entropy_selection_modes_keep_the_chosen_rollout(mode, kept):
    m = ExperienceManager(num_generations=4, select_mode=mode)
    m.collect("a", [traj("a", 0.5), traj("a", 0.2), traj("a", 0.9)])
    assert entropies(m, "a") == [kept]


def test_random_selection_is_seeded():
    picks = []
    for _ in range(2):
        m = ExperienceManager(num_generations=4, select_mode="random", seed=3)
        for i in range(20):
            m.collect(f"t{i}", [traj(f"t{i}", e) for e in (0.1, 0.2, 0.3)])
        picks.append([entropies(m, f"t{i}")[0] for i in range(20)])
    assert picks[0] == picks[1]
    assert len(set(picks[0])) == 3  # not always the same candidate


def test_masked_entropy_ignores_padding():
    ent = torch.tensor([[1.0, 2.0, 3.0, 100.0], [4.0, 0.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 1, 0], [0, 0, 0, 0]])
    assert masked_mean_entropy(ent, mask).tolist() == [2.0, 0.0]  # the padded mean would be 26.5
    assert ent[0].mean().item() == 26.5


def test_cap_replaces_the_worst_under_argmin_and_is_fifo_under_random():
    m = ExperienceManager(num_generations=4, max_trajectories_per_task=2)
    for e in (0.5, 0.4):
        m.collect("a", [traj("a", e)])
    m.collect("a", [traj("a", 0.3)])  # better than the worst stored (0.5): replaces it
    assert entropies(m, "a") == [0.3, 0.4]
    m.collect("a", [traj("a", 0.9)])  # worse than all: dropped
    assert entropies(m, "a") == [0.3, 0.4]

    m = ExperienceManager(num_generations=4, max_trajectories_per_task=2, select_mode="argmax")
    for e in (0.5, 0.4, 0.45, 0.1):
        m.collect("a", [traj("a", e)])
    assert entropies(m, "a") == [0.45, 0.5]

    m = ExperienceManager(num_generations=4, max_trajectories_per_task=2, select_mode="random")
    for e in (0.5, 0.4, 0.3):
        m.collect("a", [traj("a", e)])
    assert [t.entropy for t in m.task2trajectories["a"]] == [0.4, 0.3]


def test_budget_evicts_the_oldest_policy_version_first():
    m = ExperienceManager(num_generations=4, max_buffer_tokens=20)
    m.collect("a", [traj("a", 0.1, length=4, version=0)], prompt_ids=[1, 2])
    m.collect("b", [traj("b", 0.1, length=4, version=1)], prompt_ids=[3, 4])
    m.collect("a", [traj("a", 0.2, length=4, version=2)])
    assert m.num_tokens == 2 + 2 + 12
    m.enforce_budget()
    assert m.num_tokens == 16  # within budget: nothing evicted
    m.collect("b", [traj("b", 0.2, length=4, version=3)])
    m.enforce_budget()  # 20 tokens: still fits
    m.collect("c", [traj("c", 0.2, length=4, version=4)], prompt_ids=[9])
    m.enforce_budget()  # 25 > 20: version 0 of "a" goes first
    assert [t.policy_version for t in m.task2trajectories["a"]] == [2]
    assert m.num_tokens == 17  # 25 -> 21 after version 0, still over: version 1 goes too
    versions = sorted(t.policy_version for ts in m.task2trajectories.values() for t in ts)
    assert versions == [2, 3, 4]  # version 1 went next; the newest stay
    assert "b" in m.task2trajectories


def test_budget_drops_a_task_with_its_prompt_when_its_last_trajectory_goes():
    m = ExperienceManager(num_generations=4, max_buffer_tokens=10)
    m.collect("a", [traj("a", 0.1, length=4, version=0)], prompt_ids=[1, 2], example={"prompt": "a"})
    m.collect("b", [traj("b", 0.1, length=4, version=1)], prompt_ids=[3, 4], example={"prompt": "b"})
    m.enforce_budget()
    assert list(m.task2trajectories) == ["b"] and list(m.task_prompt_ids) == ["b"] and list(m.task_examples) == ["b"]
    assert m.nbytes == 2 * 4 + 4 * (4 + 4)  # int32 prompt ids + int32 ids and float32 log-probs


def test_policy_lag_filters_replay_but_keeps_storage():
    m = ExperienceManager(num_generations=4, max_policy_lag=5)
    m.observe("a", 2, 4)
    m.collect("a", [traj("a", 0.1, version=0)])
    m.collect("a", [traj("a", 0.2, version=4)])
    assert [t.policy_version for t in m.eligible("a", step=8)] == [4]
    assert m.sample_tasks(1, k=2, step=8) == []  # only one young trajectory: not replayable with k=2
    assert m.sample_tasks(1, k=2, step=5) == ["a"]
    assert m.num_trajectories == 2


def test_sample_tasks_respects_k_exclusion_and_distinctness():
    m = ExperienceManager(num_generations=4)
    for task, successes, count in [("a", 1, 2), ("b", 2, 1), ("c", 3, 2), ("d", 2, 2)]:
        m.observe(task, successes, 4)
        for i in range(count):
            m.collect(task, [traj(task, 0.1 * i)])
    chosen = m.sample_tasks(5, k=2, step=0, exclude=["d"])
    assert sorted(chosen) == ["a", "c"]
    assert m.select_trajectories("a", 2, step=0)[0].entropy == 0.0


@pytest.mark.parametrize("weighting, expected", [("uniform", 0.5), ("gaussian", 1 / (1 + 0.6065))])
def test_bucket_weighting(weighting, expected):
    m = ExperienceManager(num_generations=4, bucket_weighting=weighting, seed=0)
    m.observe("one", 1, 4)
    m.observe("two", 2, 4)
    for task in ("one", "two"):
        m.collect(task, [traj(task, 0.1)])
    draws = Counter(m.sample_tasks(1, k=1, step=0)[0] for _ in range(4000))
    assert draws["two"] / 4000 == pytest.approx(expected, abs=0.03)


def test_state_dict_round_trip_restores_contents_and_the_rng():
    m = ExperienceManager(num_generations=4, select_mode="random", seed=1)
    for i, task in enumerate(["a", "b", "c"]):
        m.update([GroupOutcome(task, 1 + i % 3, 4, [traj(task, 0.1 * i, version=i)], [7, i], {"prompt": task})], i)
    m.observe("z", 4, 4)
    buffer = io.BytesIO()
    torch.save(m.state_dict(), buffer)
    buffer.seek(0)
    restored = ExperienceManager(num_generations=4, select_mode="random", seed=99)
    restored.load_state_dict(torch.load(buffer, weights_only=False))
    assert restored.task2bucket == m.task2bucket and restored.bucket_histogram() == m.bucket_histogram()
    assert list(restored.retired) == ["z"] and restored.task_examples == m.task_examples
    for task, ts in m.task2trajectories.items():
        for a, b in zip(ts, restored.task2trajectories[task], strict=True):
            assert torch.equal(a.completion_ids, b.completion_ids) and torch.equal(a.logps, b.logps)
            assert (a.entropy, a.policy_version, a.reward) == (b.entropy, b.policy_version, b.reward)
    assert [m.sample_tasks(2, 1, 3) for _ in range(5)] == [restored.sample_tasks(2, 1, 3) for _ in range(5)]


def test_task_id_uses_the_column_else_a_stable_prompt_hash():
    assert task_id_of({"task_id": 12, "prompt": "x"}) == "12"
    a = task_id_of({"prompt": [{"role": "user", "content": "2+2?"}]})
    assert a == task_id_of({"prompt": [{"content": "2+2?", "role": "user"}], "solution": "4"})
    assert a != task_id_of({"prompt": [{"role": "user", "content": "2+3?"}]})


def test_trajectory_rejects_mismatched_lengths():
    with pytest.raises(ValueError, match="log-probs"):
        Trajectory("a", torch.arange(3), torch.zeros(2), 1.0, 0.1, 0)
