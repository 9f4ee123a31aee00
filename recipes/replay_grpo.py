"""GRPO with experience replay (ReplayGRPOTrainer): successful past trajectories with recorded log-probs are mixed
into later groups and trained with importance sampling.

    accelerate launch recipes/replay_grpo.py                    # embedded default: SmolLM2-135M, graded arithmetic, CPU
    accelerate launch --config_file accelerate_configs/zero2.yaml recipes/replay_grpo.py --config recipes/configs/replay_grpo_qwen2.5_1.5b.yaml

Writes to `output_dir`: `metrics.json` (a per-step summary and the training log), `learning_curves.png` (accuracy,
replay share, importance ratios, buffer size per step), checkpoints with the replay buffer, and the trained model.
"""

from trl_ext.recipe.replay import run


if __name__ == "__main__":
    run()
