"""The calibration benchmark's single-turn RLCR baseline (benchmarks/single_turn_rlcr.py): GRPOTrainer with its KL
term on the answer tokens only, checked against plain GRPOTrainer on the same scripted batch; and the benchmark's
bookkeeping (benchmarks/rlcr_bench.py calibration): measured tokens and matched rows, the baseline's settings, the
per-seed verdict, the merge of seeds run in parallel, and the whole path on a tiny model."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from datasets import Dataset
from trl import GRPOConfig, GRPOTrainer

from trl_ext.core.tail_spans import tail_token_mask
from trl_ext.evaluation.records import read_jsonl
from trl_ext.evaluation.rlcr import calibration_evaluation
from trl_ext.models.probability_warmup import probability_confidence_examples
from trl_ext.recipe import rlcr as rlcr_recipe
from trl_ext.testing import BatchRecorder, ScriptedGeneration, cpu_test_args, tiny_causal_lm, tiny_checkpoint
from trl_ext.trainers import RLCRMultiTurnConfig


sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
single_turn = pytest.importorskip("single_turn_rlcr")

QUESTIONS = [("What is 2+3?", "5"), ("What is 7*6?", "42")]
REPLIES = {  # question -> reply k: right and confident, wrong, a format failure (no </answer>), right and unsure
    "2+3": [
        "<answer>5</answer><confidence>0.9</confidence>",
        "<answer>6</answer> <confidence>0.8</confidence>",
        "5, confidence 0.5",
        "<answer>5</answer>\n<confidence>0.3</confidence>",
    ],
    "7*6": [
        "<answer>42</answer><confidence>1.0</confidence>",
        "<answer>41</answer><confidence>0.1</confidence>",
        "<answer>42</answer>",
        "<think>7*6</think><answer>42</answer><confidence>0.6</confidence>",
    ],
}


def script(prompt_text, k):
    return REPLIES["2+3" if "2+3" in prompt_text else "7*6"][k]


def make_trainer(tmp_path, trainer_cls, model=None, **overrides):
    tiny, tokenizer = tiny_causal_lm()
    dataset = Dataset.from_list([{"prompt": [{"role": "user", "content": q}], "solution": s} for q, s in QUESTIONS])
    settings = dict(max_steps=1, per_device_train_batch_size=8, shuffle_dataset=False, max_completion_length=32)
    args = cpu_test_args(tmp_path, GRPOConfig, **{**settings, **overrides})
    return trainer_cls(
        model=model or tiny,
        reward_funcs=single_turn.single_turn_rlcr_reward(),
        args=args,
        train_dataset=dataset,
        processing_class=tokenizer,
    )


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return str(tiny_checkpoint(tmp_path_factory.mktemp("model"), initializer_range=0.5))


@pytest.fixture(scope="module")
def batch(tmp_path_factory, checkpoint):
    trainer = make_trainer(tmp_path_factory.mktemp("run"), single_turn.AnswerKLGRPOTrainer, checkpoint, beta=0.1)
    with ScriptedGeneration(trainer, script), BatchRecorder(trainer) as rec:
        trainer.train()
    return trainer, rec.batches[0]


def test_the_batch_marks_the_tokens_after_the_answer(batch):
    trainer, batch = batch
    tail, mask = batch[single_turn.TAIL_KEY], batch["completion_mask"]
    for ids, row_tail, row_mask in zip(batch["completion_ids"], tail, mask):
        n = int(row_mask.sum())
        assert row_tail[:n].tolist() == tail_token_mask(trainer._tokenizer, ids[:n].tolist(), "</answer>")
        assert not row_tail[n:].any()
    replies = [reply for question in ("2+3", "7*6") for reply in REPLIES[question]]  # recorded before shuffling
    for reply, ids, row_tail, row_mask in zip(replies, batch["completion_ids"], tail, mask):
        ids, row_tail = ids[row_mask.bool()], row_tail[row_mask.bool()].bool()
        head, after = (trainer._tokenizer.decode(ids[m]) for m in (~row_tail, row_tail))
        if "</answer>" not in reply:
            assert not row_tail.any()  # a format failure keeps the KL everywhere
            continue
        answer = reply[: reply.rindex("</answer>") + len("</answer>")]
        # the answer part through </answer> (and a token straddling its end), the rest with the EOS token in the tail
        assert head.startswith(answer) and len(head) <= len(answer) + 1
        assert after.endswith(trainer._tokenizer.eos_token) and "answer" not in after
        assert reply[len(answer) :] in head[len(answer) :] + after


def test_kl_is_zero_on_the_confidence_and_unchanged_on_the_answer(batch, checkpoint, tmp_path):
    """With a reference the policy has drifted from: our loss equals plain GRPOTrainer's with the reference set to the
    policy on the tail tokens, and with zero advantages (the loss is then the KL term alone) it equals plain
    GRPOTrainer's KL over the answer tokens only."""
    _, batch = batch
    inputs = {k: v for k, v in batch.items() if isinstance(v, torch.Tensor)}
    tail = inputs[single_turn.TAIL_KEY].bool()
    assert tail.any() and (~tail & inputs["completion_mask"].bool()).any()
    ours = make_trainer(tmp_path / "ours", single_turn.AnswerKLGRPOTrainer, checkpoint, beta=0.1)
    plain = make_trainer(tmp_path / "plain", GRPOTrainer, checkpoint, beta=0.1)
    for trainer in (ours, plain):
        trainer.current_gradient_accumulation_steps = 1
    with torch.no_grad():
        ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], dim=1)
        attention = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
        logits_to_keep = inputs["completion_ids"].size(1)
        policy, _, _ = plain._get_per_token_logps_and_entropies(plain.model, ids, attention, logits_to_keep)
    noise = torch.randn(policy.shape, generator=torch.Generator().manual_seed(0))
    inputs["ref_per_token_logps"] = drifted = policy + 0.5 * noise
    without_tail = {k: v for k, v in inputs.items() if k != single_turn.TAIL_KEY}

    def loss(trainer, batch):
        return trainer._compute_loss(trainer.model, batch).item()

    anchored_answers = {**without_tail, "ref_per_token_logps": torch.where(tail, policy, drifted)}
    assert loss(ours, inputs) == pytest.approx(loss(plain, anchored_answers), abs=1e-5)
    assert abs(loss(ours, inputs) - loss(plain, without_tail)) > 1e-3  # the tail's KL was not 0 to begin with
    assert torch.equal(inputs["ref_per_token_logps"], drifted)  # the batch is left as it was, for later iterations

    zero = torch.zeros_like(inputs["advantages"])
    kl_only = {**inputs, "advantages": zero}
    answer_kl = {**without_tail, "advantages": zero, "tool_mask": (~tail).long()}  # TRL's loss mask * tool_mask
    assert loss(ours, kl_only) == pytest.approx(loss(plain, answer_kl), abs=1e-6)
    assert loss(ours, kl_only) > 1e-3
    # and a batch without a tail mask is plain GRPO
    assert loss(ours, without_tail) == pytest.approx(loss(plain, without_tail), abs=1e-6)


def test_single_turn_twins_state_a_confidence_turns_value_after_its_answer_in_one_reply():
    turn = {
        "prompt": [
            {"role": "system", "content": "Answer inside <answer></answer>."},
            {"role": "user", "content": "What is 2+3?"},
            {"role": "assistant", "content": "<answer>6</answer>"},
            {"role": "user", "content": "Confidence?"},
        ],
        "completion": [{"role": "assistant", "content": "<confidence>0.3</confidence>"}],
    }
    assert single_turn.single_turn_twins([turn], "Both, one reply.") == [
        {
            "prompt": [{"role": "system", "content": "Both, one reply."}, {"role": "user", "content": "What is 2+3?"}],
            "completion": [{"role": "assistant", "content": "<answer>6</answer><confidence>0.3</confidence>"}],
        }
    ]


# -- the benchmark's bookkeeping (benchmarks/rlcr_bench.py calibration) -----------------------------------------------
bench = pytest.importorskip("rlcr_bench")


@pytest.mark.parametrize(
    ("beta", "confidence_beta", "trainer"),
    [(0.5, 0.0, "AnswerKLGRPOTrainer"), (0.5, 0.5, "GRPOTrainer"), (0.5, None, "GRPOTrainer")],
)
def test_single_turn_baseline_places_its_kl_as_multi_turn_does(beta, confidence_beta, trainer):
    args = RLCRMultiTurnConfig(output_dir="unused", beta=beta, confidence_beta=confidence_beta, use_cpu=True)
    assert bench.single_turn_trainer(args).__name__ == trainer


def test_single_turn_baseline_refuses_a_kl_it_cannot_place():
    args = RLCRMultiTurnConfig(output_dir="unused", beta=0.5, confidence_beta=0.2, use_cpu=True)
    with pytest.raises(SystemExit, match="--confidence_beta 0 or the value of --beta"):
        bench.single_turn_trainer(args)


def test_tokens_per_step_and_matched_rows_by_hand():
    logs = [
        {"completions/mean_length": 10.0, "confidence/completions/mean_length": 5.0, "step_time": 1.0},
        {"eval_thing": 1.0},  # not a step's log
        {"completions/mean_length": 12.0, "confidence/completions/mean_length": 4.0, "step_time": 1.0},
        {"train_runtime": 3.0},
    ]
    counts = {"completions/mean_length": 16, "confidence/completions/mean_length": 64}
    assert bench.tokens_per_step(logs, counts) == [16 * 10 + 64 * 5, 16 * 12 + 64 * 4]  # 480, 448
    # 780 tokens per step at 17.5 tokens per reply: 44.6 replies, 11.1 groups of 4 -> 11 groups
    assert bench.matched_rows(780.0, 17.5, 4) == 44
    assert bench.matched_rows(780.0, 15.0, 4) == 52  # 13 groups
    assert bench.matched_rows(10.0, 28.0, 4) == 4  # at least one group


def test_single_turn_overrides_are_grpo_fields_with_values_read_as_json():
    overrides = bench.single_turn_overrides(["--learning_rate", "1e-5", "--scale_rewards", "group", "--beta", "0"])
    assert overrides == {"learning_rate": 1e-5, "scale_rewards": "group", "beta": 0}
    with pytest.raises(SystemExit, match="'--lr' is not a GRPOConfig field"):
        bench.single_turn_overrides(["--lr", "1e-5"])
    with pytest.raises(SystemExit, match="--max_steps is set by the benchmark"):
        bench.single_turn_overrides(["--max_steps", "3"])
    with pytest.raises(SystemExit, match="pairs"):
        bench.single_turn_overrides(["--beta"])


def _run(seed, auroc_within, tokens):
    final = {key: 0.5 for key in bench.POINT_METRICS} | {"accuracy": 0.4, "parse_fail_rate": 0.0}
    final |= {"auroc_within_groups": auroc_within, "generated_tokens": tokens}
    return {"seed": seed, "points": [{**final, "generated_tokens": 0.0}, final]}


def _result(seed, multi, single, ratio):
    runs = {"multi_turn": [_run(seed, multi, 1000.0)], "single_turn": [_run(seed, single, 1000.0 * ratio)]}
    tokens = {str(seed): {"multi_turn_per_step": 62.5, "single_over_multi": ratio}}
    settings = dict(
        steps=16,
        split="report",
        evaluate_every=4,
        agreement_samples=8,
        single_turn={"settings": {}, "trainer": "GRPOTrainer"},
    )
    settings |= {"model": "a warm-up", "evaluation": "200 held-out questions of the report split, greedy"}
    return {
        **settings,
        "seeds": [seed],
        "warmup_models": {str(seed): f"/w/{seed}"},
        "generated_tokens": tokens,
        "runs": runs,
        "summary": bench.calibration_summary(runs, tokens),
    }


def test_summary_says_per_seed_whether_multi_turn_within_level_auroc_is_at_least_single_turns():
    merged = bench.merge_calibration(
        [
            {**_result(42, 0.7, 0.6, 1.02), "provenance": {"p": 42}},
            {**_result(43, 0.5, 0.5, 0.98), "provenance": {"p": 43}},
            _result(44, None, 0.6, 1.0),
        ]
    )
    summary = merged["summary"]
    assert merged["seeds"] == [42, 43, 44] and set(merged["warmup_models"]) == {"42", "43", "44"}
    assert [part["seeds"] for part in merged["merged_from"]] == [[42], [43], [44]]
    assert [part["provenance"] for part in merged["merged_from"]] == [{"p": 42}, {"p": 43}, None]
    assert summary["seeds"] == [42, 43, 44]
    assert summary["multi_minus_single_auroc_within_groups"] == pytest.approx([0.1, 0.0, None])
    assert summary["multi_within_level_auroc_at_least_single"] == [True, True, None]
    assert summary["verdict"].startswith("multi-turn's within-level AUROC >= single-turn's in 2 of 3 seeds")
    assert "1.02, 0.98, 1.00 x multi-turn's tokens per step" in summary["verdict"]
    assert summary["single_turn"]["generated_tokens"] == {"42": 1020.0, "43": 980.0, "44": 1000.0}
    assert summary["multi_turn"]["auroc_within_groups"] == {"mean": 0.6, "min": 0.5, "max": 0.7}
    with pytest.raises(ValueError, match="differ in 'split'"):
        bench.merge_calibration([_result(42, 0.7, 0.6, 1.0), {**_result(43, 0.7, 0.6, 1.0), "split": "tune"}])
    # one method alone (a sweep of the baseline): its figures, no comparison
    alone = bench.calibration_summary({"single_turn": _result(42, 0.7, 0.6, 1.0)["runs"]["single_turn"]}, {})
    assert set(alone) == {"single_turn"}


def test_summary_gives_multi_turns_mean_of_k_column_where_the_final_evaluation_has_it():
    rows = [  # greedy: one constant; the mean of 2 sampled confidences separates the level-1 pair
        {"correct": 1, "confidence": 0.5, "group": 1, "sampled_confidences": [0.9, None], "confidence_mean": 0.9},
        {"correct": 0, "confidence": 0.5, "group": 1, "sampled_confidences": [0.1, 0.3], "confidence_mean": 0.2},
    ]
    evaluation = calibration_evaluation(
        rows, confidence_samples_cost={"samples_per_question": 2, "generated_tokens": 9}
    )
    point = bench._evaluation_point(evaluation, final=True)
    mean = point[bench.MEAN_OF_K]
    assert mean["auroc_within_groups"] == 1.0 and mean["generated_tokens"] == 9 and "bins" not in mean
    assert bench.MEAN_OF_K not in bench._evaluation_point(evaluation, final=False)
    runs = _result(42, 0.5, 0.5, 1.0)["runs"]
    runs["multi_turn"][0]["points"][-1][bench.MEAN_OF_K] = mean
    summary = bench.calibration_summary(runs, {})
    assert summary["multi_turn"][bench.MEAN_OF_K]["auroc_within_groups"] == {"mean": 1.0, "min": 1.0, "max": 1.0}
    assert bench.MEAN_OF_K not in summary["single_turn"]  # its confidence is in the answer's completion


@pytest.mark.slow  # about a minute on 2 busy cores: two short runs and five evaluations on a tiny model
def test_calibration_runs_both_methods_on_a_tiny_model_and_reports_their_tokens(tmp_path, monkeypatch):
    """The benchmark's whole path (warm-up, multi-turn, token matching, single-turn, evaluations, summary) with the
    recipe's settings made tiny and a tiny random model in place of the warm-up."""
    checkpoint = tiny_checkpoint(tmp_path / "tiny")
    small = ["--max_steps", "2", "--per_device_train_batch_size", "2", "--gradient_accumulation_steps", "1"]
    small += ["--num_generations", "2", "--num_generations_confidence", "2", "--max_completion_length", "8"]
    small += ["--max_confidence_length", "6", "--num_train_samples", "40", "--num_eval_samples", "6"]
    small += ["--warmup_samples", "4", "--bf16", "false", "--per_device_eval_batch_size", "6"]
    real = bench.rlcr_cpu_run
    builds = []  # each warm-up stage's examples

    def tiny_run(flags):
        script_args, args, train, evaluation = real((*flags, *small))
        script_args.build_warmup = lambda base, examples, seeded: (builds.append(list(examples)), (checkpoint, 0.0))[1]
        return script_args, args, train, evaluation

    def judged(stage1, rows, confidence_prompt, **kwargs):  # the second stage's answers, stated 0.2 or 0.7 in turn
        prompts = [list(row["prompt"]) for row in rows]
        stated = [(0.2, 0.7)[i % 2] for i in range(len(rows))]
        examples = probability_confidence_examples(
            prompts, ["<answer>3</answer>"] * len(rows), stated, confidence_prompt
        )
        return {"examples": examples, "stats": {}}

    monkeypatch.setattr(bench, "rlcr_cpu_run", tiny_run)
    monkeypatch.setattr(rlcr_recipe, "probability_examples", judged)
    monkeypatch.setattr(bench, "default_model_path", lambda: checkpoint)
    result, records = bench.calibration(
        None, [7], 1, "tune", 2, overrides={"learning_rate": 1e-4}, confidence_samples=2
    )

    # The recipe's two stages, teaching both formats: the second states each confidence in the single-turn format too.
    stage1, stage2 = builds
    system = bench.SINGLE_TURN_SUFFIX
    single = [e for e in stage2 if e["prompt"][0]["content"].endswith(system)]
    confidence_turns = [e for e in stage2 if len(e["prompt"]) == 4]
    assert len(single) == len(confidence_turns) == 36  # the 36 RL rows, as many stating 0.2 as 0.7
    assert sorted(e["completion"][0]["content"] for e in single) == sorted(
        "<answer>3</answer>" + e["completion"][0]["content"] for e in confidence_turns
    )
    answer_turns = [e for e in stage1 if len(e["prompt"]) == 2 and not e["prompt"][0]["content"].endswith(system)]
    assert len(answer_turns) == 4 and len(stage2) == 36 + 36 + 4 * 9  # answer turns repeated to about 36
    # the first stage has the recipe's warm-up rows, the second RL's: none of them in both
    warmup_questions = {e["prompt"][1]["content"] for e in answer_turns}
    assert len(warmup_questions) == 4 and not warmup_questions & {e["prompt"][1]["content"] for e in confidence_turns}
    assert result["single_turn"]["trainer"] == "GRPOTrainer"  # the default's KL covers the confidence turn too

    tokens = result["generated_tokens"]["7"]
    assert tokens["multi_turn_rows_per_step"] == 2 * (1 + 2)
    # measured: at most 2 answers x 8 tokens + 4 confidences x 6 tokens per step
    assert 0 < tokens["multi_turn_per_step"] <= 40 and tokens["multi_turn_total"] == 2 * tokens["multi_turn_per_step"]
    assert tokens["single_turn_target_per_step"] == tokens["multi_turn_per_step"]
    assert tokens["single_turn_rows_per_step"] == bench.matched_rows(
        tokens["multi_turn_per_step"], tokens["single_turn_probe_reply_tokens"], 4
    )
    assert tokens["single_over_multi"] == pytest.approx(tokens["single_turn_per_step"] / tokens["multi_turn_per_step"])
    settings = result["single_turn"]["settings"]
    assert settings["learning_rate"] == 1e-4 and settings["scale_rewards"] == "batch" and settings["beta"] == 0.5
    for method in ("multi_turn", "single_turn"):
        (run,) = result["runs"][method]
        assert [p["step"] for p in run["points"]] == [0, 1, 2] and "intervals" in run["points"][-1]
        assert run["points"][-1]["generated_tokens"] == pytest.approx(tokens[f"{method}_total"])
        assert {r["method"] for r in records} == {"multi_turn", "single_turn"}
    assert len(result["summary"]["multi_within_level_auroc_at_least_single"]) == 1
    # multi-turn's final evaluation: the mean of 2 sampled stated confidences per answer, beside the greedy one
    mean = result["runs"]["multi_turn"][0]["points"][-1][bench.MEAN_OF_K]
    assert mean["samples_per_question"] == 2 and 0 < mean["generated_tokens"] <= 6 * 2 * 6
    assert all(len(r["sampled_confidences"]) == 2 for r in records if r["method"] == "multi_turn")
    assert result["confidence_samples"] == 2
    assert result["summary"]["verdict"].startswith("multi-turn's within-level AUROC >= single-turn's in ")


def test_parallel_runs_one_process_per_seed_with_the_same_flags_and_merges_them(tmp_path, monkeypatch):
    commands = []

    def fake_run(command, env, **kwargs):  # a child: writes its seed's result where the parent points it
        commands.append((command, env["OMP_NUM_THREADS"]))
        seed = int(command[command.index("--seeds") + 1])
        out = Path(env["TRL_EXT_BENCH_RESULTS"])
        out.mkdir(parents=True)
        (out / "rlcr_calibration_sweep.json").write_text(json.dumps(_result(seed, 0.6, 0.5, 1.0)))
        (out / "rlcr_calibration_sweep.jsonl").write_text(json.dumps({"seed": seed}) + "\n")
        return subprocess.CompletedProcess(command, 0)

    monkeypatch.setattr(bench.subprocess, "run", fake_run)
    monkeypatch.setattr(bench.os, "cpu_count", lambda: 16)
    argv = ["calibration", "--split", "report", "--seeds", "42", "43", "44", "--parallel", "3", "--tag", "sweep"]
    args = bench.build_parser().parse_args(argv)
    result, records = bench.calibration_parallel(args, ["--learning_rate", "1e-4"])
    assert sorted(seed for seed in result["seeds"]) == [42, 43, 44] and len(records) == 3
    assert result["summary"]["multi_within_level_auroc_at_least_single"] == [True, True, True]
    for command, threads in commands:
        assert threads == "5"  # 16 cores, 3 processes
        assert command[command.index("--split") + 1] == "report" and command[command.index("--tag") + 1] == "sweep"
        assert command[-3:] == ["--", "--learning_rate", "1e-4"] and "--parallel" not in command


def test_merge_flag_joins_results_run_apart_with_their_records(tmp_path, monkeypatch):
    for seed in (42, 43):
        bench.write_result(tmp_path / f"s{seed}.json", _result(seed, 0.6, 0.7, 1.0), records=[{"seed": seed}])
    monkeypatch.setattr(bench, "RESULTS", tmp_path / "out")
    bench.main(["calibration", "--merge", str(tmp_path / "s42.json"), str(tmp_path / "s43.json")])
    merged = json.loads((tmp_path / "out" / "rlcr_calibration.json").read_text())  # the report split's name
    assert merged["seeds"] == [42, 43] and merged["provenance"]["seeds"] == [42, 43]
    assert merged["summary"]["multi_within_level_auroc_at_least_single"] == [False, False]
    assert read_jsonl(tmp_path / "out" / "rlcr_calibration.jsonl") == [{"seed": 42}, {"seed": 43}]
    assert (tmp_path / "out" / "rlcr_calibration.png").is_file()
