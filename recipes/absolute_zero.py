"""Self-play with AbsoluteZeroTrainer: the model proposes questions from seed prompts and learns to solve the learnable
ones, proposer and solver rows in one update.

    accelerate launch recipes/absolute_zero.py                 # embedded default: SmolLM2-135M, arithmetic, CPU
    accelerate launch recipes/absolute_zero.py --model_name_or_path Qwen/Qwen2.5-1.5B-Instruct --use_vllm \\
        --dataset_path seeds.jsonl --question_column seed --use_peft --push_to_hub --hub_model_id me/az-arithmetic

    accelerate launch recipes/absolute_zero.py --config recipes/configs/absolute_zero_workspace_smollm2_cpu.yaml
    accelerate launch recipes/absolute_zero.py --config recipes/configs/absolute_zero_code_smollm2_cpu.yaml

Seed prompts: the task family's built-in seeds, or `--dataset_name` / `--dataset_path` with the seed text in
`--question_column` (or a conversational `prompt` column). The task family (`--task`) provides the question parser,
solver prompt, solver rewards, default reward weights and learnability criteria, and, for `workspace`, the solver's
environment (`WorkspaceEnvironment`: the solver acts through tools, in TRL's tool loop), and, for `code`, the triplet
buffer the proposer is conditioned on (trainer state, checked by execution in `trl_ext.sandbox`). Writes to
`output_dir`:
`metrics.json` (summary, held-out accuracy and training log), `learning_curves.png` (arithmetic: learnable ratio,
repropose attempts, proposer reward, solver accuracy; workspace: learnable ratio, safety and completion means, tool
calls per episode; code: invalid proposals, learnable ratio, solver accuracy, buffer size; per step), for `code` the
final buffer (`task_state.json`), and the model. Arithmetic and code also get the solver's greedy accuracy on the
family's fixed held-out questions before and after training: `heldout_before.json` / `heldout_after.json` (every
question, reply and score) and `heldout_accuracy.png` (before/after, overall and per level or task type, next to the
learnable ratio per step).
"""

from trl_ext.recipe.absolute_zero import run


if __name__ == "__main__":
    run()
