"""Runs under torchrun: scripted ReplayGRPOTrainer runs; reports plans, buffer and weights per rank.

Usage:
  replay_ranks.py ranks PER_DEVICE              several steps; with 2 ranks and 6 rows each a group spans both ranks
  replay_ranks.py full OUTPUT_DIR               4 steps, checkpoint at step 2
  replay_ranks.py resume OUTPUT_DIR             resume from OUTPUT_DIR/checkpoint-2 and finish the 4 steps
"""

import hashlib
import os
import sys
import tempfile


sys.path.insert(0, os.path.dirname(__file__))

from replay_world import make_trainer, scripted

from trl_ext.testing import weights_digest, write_rank_result


def plan_summary(plan, step):
    stored = [None if t is None else (t.task_id, t.completion_ids.tolist(), t.policy_version) for t in plan.stored]
    return {
        "step": step,
        "group_tasks": plan.group_tasks,
        "global_stored": plan.global_stored,
        "local_stored": stored,
        "fresh_local": sum(t is None for t in plan.stored),
        "fresh_max": plan.fresh_max,
    }


def buffer_summary(manager):
    return {
        "buckets": {str(b): list(tasks) for b, tasks in manager.difficulty2task.items()},
        "retired": list(manager.retired),
        "trajectories": {
            task: [(t.completion_ids.tolist(), t.policy_version, round(t.entropy, 5)) for t in ts]
            for task, ts in manager.task2trajectories.items()
        },
        "logps": {task: [t.logps.tolist() for t in ts] for task, ts in manager.task2trajectories.items()},
        "rng": hashlib.sha256(repr(manager.rng.getstate()).encode()).hexdigest(),
    }


def run(trainer, resume=None):
    plans = []
    with scripted(trainer):
        original = trainer._plan_batch

        def plan_at_step(inputs):
            plan = original(inputs)
            plans.append(plan_summary(plan, trainer.state.global_step))
            return plan

        trainer._plan_batch = plan_at_step
        try:
            trainer.train(resume_from_checkpoint=resume)
        finally:
            del trainer._plan_batch
    return plans


def main():
    mode = sys.argv[1]
    if mode == "ranks":
        trainer = make_trainer(
            tempfile.mkdtemp(), tasks="ABCDEF", per_device_train_batch_size=int(sys.argv[2]), max_steps=6
        )
        plans = run(trainer)
    else:
        output_dir = sys.argv[2]
        trainer = make_trainer(output_dir, save_strategy="steps", save_steps=2, max_steps=4)
        resume = os.path.join(output_dir, "checkpoint-2") if mode == "resume" else None
        plans = run(trainer, resume)
    model = trainer.accelerator.unwrap_model(trainer.model)
    write_rank_result(
        {
            "plans": plans,
            "buffer": buffer_summary(trainer.experience),
            "replay_logs": [
                {k: v for k, v in h.items() if k.startswith("replay/")} for h in trainer.state.log_history
            ],
            "digest": weights_digest(model),
            "world_size": trainer.accelerator.num_processes,
        }
    )


if __name__ == "__main__":
    main()
