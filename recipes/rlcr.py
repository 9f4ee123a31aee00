"""Train calibrated confidence with RLCRMultiTurnTrainer: answer, then a confidence turn per fixed answer.

    accelerate launch recipes/rlcr.py                          # embedded default: SmolLM2-135M, built-in data, CPU
    accelerate launch --config_file accelerate_configs/zero2.yaml recipes/rlcr.py --config recipes/configs/rlcr_qwen2.5_1.5b.yaml
    python recipes/rlcr.py --eval_only --model_name_or_path outputs/rlcr-smollm2-cpu

Writes to `output_dir`: `metrics.json` (calibration before/after and the training log), `reliability_before.png`,
`reliability_after.png`, `reliability_before_after.png`, `learning_curves.png`, `eval_before.json` and
`eval_after.json` (the metrics with bootstrap 95% intervals), `eval_before.jsonl` and `eval_after.jsonl` (every
question, answer and confidence), `evaluation_settings.json` (what the evaluation used;
`--eval_only` on the directory reuses it unless flags override), and the trained model.
"""

from trl_ext.recipe.rlcr import run


if __name__ == "__main__":
    run()
