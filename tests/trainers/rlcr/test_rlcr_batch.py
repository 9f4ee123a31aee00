"""RLCRMultiTurnTrainer with scripted generation: the exact two-turn batch, by hand.

Two prompts, G_a = 2 answers each, G_c = 2 confidences per answer: 4 answer rows, then 8 confidence rows.
"""

import math

import numpy as np
import pytest
import torch
from datasets import Dataset

from trl_ext.testing import BatchRecorder, ScriptedGeneration, cpu_test_args, tiny_causal_lm, tiny_checkpoint
from trl_ext.trainers import RLCRMultiTurnConfig, RLCRMultiTurnTrainer


QUESTIONS = [("What is 2+3?", "5"), ("What is 7*6?", "42")]
ANSWERS = {  # question -> the completion of answer k
    "2+3": ["<think>add</think><answer>5</answer>", "<think>guess</think><answer>6</answer>"],  # right, wrong
    "7*6": ["<answer>42</answer>", "I don't know"],  # right (no <think>), format failure
}
CONFIDENCES = {  # answer text -> the completion of confidence sample h
    "<answer>5</answer>": ["<analysis>sure</analysis><confidence>0.9</confidence>", "<confidence>0.6</confidence>"],
    "<answer>6</answer>": ["<confidence>0.8</confidence>", "<confidence>abc</confidence>"],
    "<answer>42</answer>": ["<confidence>1.5</confidence>", "<confidence>85%</confidence>"],
    "I don't know": ["<confidence>0.1</confidence>", "no tags at all"],
}
CONFIDENCE_PROMPT = "How confident are you? Reply <confidence>p</confidence>."


def script(prompt_text, k):
    if CONFIDENCE_PROMPT in prompt_text:
        for answer, replies in CONFIDENCES.items():
            if answer in prompt_text:
                return replies[k]
        raise AssertionError(prompt_text)
    key = "2+3" if "2+3" in prompt_text else "7*6"
    return ANSWERS[key][k]


def make_trainer(tmp_path, model=None, **overrides):
    tiny, tokenizer = tiny_causal_lm()
    dataset = Dataset.from_list([{"prompt": [{"role": "user", "content": q}], "solution": s} for q, s in QUESTIONS])
    settings = dict(
        max_steps=1,
        per_device_train_batch_size=4,
        num_generations=2,
        num_generations_confidence=2,
        confidence_prompt=CONFIDENCE_PROMPT,
        shuffle_dataset=False,
        max_completion_length=32,
        max_confidence_length=16,
    )
    args = cpu_test_args(tmp_path, RLCRMultiTurnConfig, **{**settings, **overrides})
    return RLCRMultiTurnTrainer(model=model or tiny, args=args, train_dataset=dataset, processing_class=tokenizer)


def run_one_step(trainer):
    lengths = []

    def recording_script(prompt_text, k):
        lengths.append(trainer.generation_config.max_new_tokens)
        return script(prompt_text, k)

    with ScriptedGeneration(trainer, recording_script) as gen, BatchRecorder(trainer) as rec:
        trainer.train()
    return gen, rec.batches[0], lengths


@pytest.fixture(scope="module")
def step(tmp_path_factory):
    trainer = make_trainer(tmp_path_factory.mktemp("rlcr"))
    gen, batch, lengths = run_one_step(trainer)
    return trainer, gen, batch, lengths


def test_two_generation_calls_with_their_own_group_sizes_and_lengths(step):
    trainer, gen, batch, lengths = step
    assert len(gen.calls) == 2
    assert gen.calls[0].num_generations == 2 and len(gen.calls[0].prompt_ids) == 4  # B * G_a answers
    assert gen.calls[1].num_generations == 2 and len(gen.calls[1].prompt_ids) == 8  # B * G_a * G_c confidences
    assert lengths == [32] * 4 + [16] * 8  # max_completion_length, then max_confidence_length
    assert trainer.generation_config.max_new_tokens == 32  # restored


def test_rows_and_order(step):
    trainer, gen, batch, _ = step
    tok = trainer.processing_class
    assert batch["row_kind"].tolist() == [0] * 4 + [1] * 8
    assert batch["completion_ids"].shape[0] == 12 and batch["prompt_ids"].shape[0] == 12
    answers = [tok.decode(ids, skip_special_tokens=True) for ids in gen.calls[0].completion_ids]
    assert answers == ANSWERS["2+3"] + ANSWERS["7*6"]
    confidences = [tok.decode(ids, skip_special_tokens=True) for ids in gen.calls[1].completion_ids]
    expected = [reply for answer in answers for reply in CONFIDENCES[answer.split("</think>")[-1]]]
    assert confidences == expected  # grouped by parent answer, in answer order
    for row, ids in enumerate(gen.calls[0].completion_ids + gen.calls[1].completion_ids):
        n = int(batch["completion_mask"][row].sum())
        assert batch["completion_ids"][row, :n].tolist() == ids


def test_turn_two_prompts_are_prefix_consistent(step):
    trainer, gen, batch, _ = step
    tok = trainer.processing_class
    first, second = gen.calls
    for i, turn2 in enumerate(second.prompt_ids):
        prompt, answer = first.prompt_ids[i // 2], first.completion_ids[i // 2]
        assert turn2[: len(prompt) + len(answer)] == prompt + answer  # exactly the sampled context
        assert tok.decode(turn2[len(prompt) + len(answer) :]) == (
            f"\n<|im_start|>user\n{CONFIDENCE_PROMPT}<|im_end|>\n<|im_start|>assistant\n"
        )
        # and the batch trains on that same prompt (left-padded)
        n = int(batch["prompt_mask"][4 + i].sum())
        assert batch["prompt_ids"][4 + i, -n:].tolist() == turn2


def test_advantages_by_hand(step):
    _, _, batch, _ = step
    std = 0.5**0.5  # unbiased std of [1, 0]
    answer = [0.5 / (std + 1e-4), -0.5 / (std + 1e-4)] * 2  # accuracy [1, 0] for both prompts
    # Brier 1 - (acc - c)^2, 0 when unparsable; confidence advantages subtract the sibling mean (no std scaling):
    #   answer 5  (acc 1): c .9 -> .99,  c .6 -> .84      mean .915   -> +.075, -.075
    #   answer 6  (acc 0): c .8 -> .36,  'abc' -> 0       mean .18    -> +.18,  -.18
    #   answer 42 (acc 1): 1.5 -> 0,     85% -> .9775     mean .48875 -> -.48875, +.48875
    #   format failure (acc 0): c .1 -> .99, no tag -> 0  mean .495   -> +.495, -.495
    confidence = [0.075, -0.075, 0.18, -0.18, -0.48875, 0.48875, 0.495, -0.495]
    torch.testing.assert_close(batch["advantages"], torch.tensor(answer + confidence), rtol=0, atol=1e-5)


def test_span_masks(step):
    trainer, gen, batch, _ = step
    tok = trainer.processing_class
    mask = batch["tool_mask"] * batch["completion_mask"]

    def trained_text(row, ids):
        return tok.decode([t for t, m in zip(ids, mask[row].tolist()) if m])

    ids = gen.calls[0].completion_ids + gen.calls[1].completion_ids
    assert trained_text(0, ids[0]) == "<think>add</think><answer>5</answer><|im_end|>"
    assert trained_text(2, ids[2]) == "<answer>42</answer><|im_end|>"  # no <think>: from the start
    assert trained_text(3, ids[3]) == "I don't know<|im_end|>"  # format failure: whole completion
    assert trained_text(4, ids[4]) == "<analysis>sure</analysis><confidence>0.9</confidence><|im_end|>"
    assert trained_text(11, ids[11]) == "no tags at all<|im_end|>"
    assert batch["num_items_in_batch"].item() == mask.sum().item()


def test_no_nan_anywhere(step):
    _, _, batch, _ = step
    for key, value in batch.items():
        if isinstance(value, torch.Tensor) and value.is_floating_point():
            assert torch.isfinite(value).all(), key


def test_metrics(step):
    trainer, _, _, _ = step
    log = trainer.state.log_history[0]
    assert log["answer/accuracy"] == 0.5
    assert log["answer/format_fail_rate"] == 0.25
    assert log["confidence/parse_fail_rate"] == pytest.approx(3 / 8)  # 'abc', 1.5, no tag
    assert log["confidence/mean"] == pytest.approx((0.9 + 0.6 + 0.8 + 0.85 + 0.1) / 5)
    # parsed (confidence, correct): (.9,1) (.6,1) (.8,0) (.85,1) (.1,0)
    # ECE bins (k/10, (k+1)/10]: {.9,.85}: |1 - .875| * 2/5; {.6}: .4/5; {.8}: .8/5; {.1}: .1/5  -> 0.31
    assert log["calibration/ece"] == pytest.approx(0.31)
    assert log["calibration/brier"] == pytest.approx((0.01 + 0.16 + 0.64 + 0.0225 + 0.01) / 5)
    assert log["calibration/auroc"] == pytest.approx(5 / 6)
    assert log["calibration/correlation"] == pytest.approx(
        np.corrcoef([0.9, 0.6, 0.8, 0.85, 0.1], [1, 1, 0, 1, 0])[0, 1]
    )
    # siblings per answer: (.9, .6), (.8, -), (-, .85), (.1, -): one answer with two parsed, std 0.15
    assert log["confidence/sibling_std"] == pytest.approx(0.15)
    assert log["confidence/answer_std"] == pytest.approx(np.std([0.75, 0.8, 0.85, 0.1]))
    assert log["answer/confidence_leak_rate"] == 0.0
    assert log["confidence/brier_reward_mean"] == pytest.approx((0.99 + 0.84 + 0.36 + 0 + 0 + 0.9775 + 0.99 + 0) / 8)
    assert log["frac_reward_zero_std"] == 0.0 and log["confidence/frac_reward_zero_std"] == 0.0
    assert log["completions/mean_length"] > 0 and log["confidence/completions/mean_length"] > 0
    assert math.isfinite(log["loss"])


def test_lambdas_and_prompt_level_normalisation(tmp_path):
    trainer = make_trainer(tmp_path, lambda_ans=2.0, lambda_conf=0.5, confidence_normalization="answer_then_prompt")
    _, batch, _ = run_one_step(trainer)
    std = 0.5**0.5
    torch.testing.assert_close(batch["advantages"][:4], torch.tensor([1, -1, 1, -1]) * 2 * 0.5 / (std + 1e-4))
    first = torch.tensor([0.075, -0.075, 0.18, -0.18, -0.48875, 0.48875, 0.495, -0.495])
    expected = torch.cat([g / (g.std() + 1e-4) for g in first.view(2, 4)]) * 0.5  # per prompt; mean is already 0
    torch.testing.assert_close(batch["advantages"][4:], expected, rtol=0, atol=1e-5)


def test_confidence_scaling_ignores_the_answer_aggregation_mode(tmp_path):
    """normalize_then_sum applies to the answer rewards; confidence rows keep their mean-only advantages."""
    trainer = make_trainer(tmp_path, multi_objective_aggregation="normalize_then_sum")
    _, batch, _ = run_one_step(trainer)
    expected = torch.tensor([0.075, -0.075, 0.18, -0.18, -0.48875, 0.48875, 0.495, -0.495])
    torch.testing.assert_close(batch["advantages"][4:], expected, rtol=0, atol=1e-5)
    assert trainer.multi_objective_aggregation == "normalize_then_sum"  # restored


def test_truncated_answer_gets_end_of_turn_in_turn_two(tmp_path):
    trainer = make_trainer(tmp_path)
    tok = trainer.processing_class
    cut = tok.encode("<think>long", add_special_tokens=False)  # no EOS: the model hit max_completion_length

    def truncating(prompt_text, k):
        if CONFIDENCE_PROMPT in prompt_text:
            return "<confidence>0.5</confidence>"
        return cut

    with ScriptedGeneration(trainer, truncating) as gen:
        trainer.train()
    turn2 = gen.calls[1].prompt_ids[0]
    prompt = gen.calls[0].prompt_ids[0]
    assert turn2[len(prompt) : len(prompt) + len(cut) + 1] == cut + [tok.eos_token_id]


class _RecordingWriter:
    """Stands in for TensorBoard's SummaryWriter: records histograms, ignores everything else."""

    def __init__(self):
        self.histograms = {}

    def add_histogram(self, name, values, step):
        self.histograms[name] = (values.tolist(), step)

    def __getattr__(self, name):
        return lambda *args, **kwargs: None


def test_histograms_reach_a_histogram_logger(tmp_path):
    from transformers.integrations import TensorBoardCallback

    trainer = make_trainer(tmp_path)
    callback = object.__new__(TensorBoardCallback)  # without tensorboard installed: only the writer is replaced
    writer = callback.tb_writer = _RecordingWriter()
    callback._SummaryWriter, callback.logging_dir = None, str(tmp_path)
    trainer.add_callback(callback)
    run_one_step(trainer)
    histograms = writer.histograms
    assert sorted(histograms) == [
        "histograms/answer/reward",
        "histograms/confidence/brier_reward",
        "histograms/confidence/stated",
    ]
    assert sorted(histograms["histograms/confidence/stated"][0]) == pytest.approx(sorted([0.9, 0.6, 0.8, 0.85, 0.1]))
    assert sorted(histograms["histograms/answer/reward"][0]) == [0.0, 0.0, 1.0, 1.0]


@pytest.mark.parametrize("share_prefix", [True, False])
def test_loss_forward_equals_the_parents_shared_padded_forward(step, share_prefix, tmp_path):
    """Packed answer families (share_prefix), or answer and confidence rows forwarded separately with their own
    padding: the same loss and gradients as TRL's forward over the padded micro-batch."""
    from trl import GRPOTrainer

    _, _, batch, _ = step
    # the scripted batch, scored by a model with large weights: attention matters, so a wrong mask or position
    # would show
    model, _ = tiny_causal_lm(initializer_range=0.5)
    trainer = make_trainer(tmp_path, model=model, share_prefix=share_prefix)
    trainer.current_gradient_accumulation_steps = 1
    inputs = {k: v for k, v in batch.items() if isinstance(v, torch.Tensor)}
    forwards = []
    model.register_forward_pre_hook(lambda m, a, kw: forwards.append(kw["input_ids"].shape), with_kwargs=True)
    results = []
    for loss_fn in (trainer._compute_loss, lambda m, x: GRPOTrainer._compute_loss(trainer, m, x)):
        model.zero_grad()
        loss = loss_fn(model, inputs)
        loss.backward()
        results.append((loss.item(), [p.grad.clone() for p in model.parameters() if p.grad is not None]))
    (ours, our_grads), (parent, parent_grads) = results
    assert ours == pytest.approx(parent, abs=1e-5) and abs(ours) > 1e-3
    for a, b in zip(our_grads, parent_grads, strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)
    if share_prefix:  # one packed sequence per answer: 4 rows, half the positions of the 12 padded rows
        width = batch["prompt_ids"].size(1) + batch["completion_ids"].size(1)
        assert forwards[0][0] == 4 and forwards[0].numel() < 12 * width / 2
    else:  # the split is real: the two row types are padded differently in the shared batch
        assert [shape[0] for shape in forwards[:2]] == [4, 8]
        prompt_widths = batch["prompt_mask"].sum(-1)
        assert prompt_widths[batch["row_kind"] == 1].min() > prompt_widths[batch["row_kind"] == 0].max()


def test_micro_batches_hold_whole_answer_families(tmp_path):
    """With steps_per_generation > 1, TRL's shuffled chunks are regrouped: each answer with its confidence rows,
    every row exactly once."""
    trainer = make_trainer(tmp_path, gradient_accumulation_steps=2, per_device_train_batch_size=2)
    micro = []
    original = trainer._compute_loss
    trainer._compute_loss = lambda model, inputs: (micro.append(inputs), original(model, inputs))[1]
    with ScriptedGeneration(trainer, script), BatchRecorder(trainer) as rec:
        trainer.train()
    assert [len(m["family"]) for m in micro] == [6, 6]
    families = [set(m["family"].tolist()) for m in micro]
    assert len(families[0]) == len(families[1]) == 2 and not families[0] & families[1]
    seen = sorted(
        (int(t), int(i), m["completion_ids"][r].tolist())
        for m in micro
        for r, (t, i) in enumerate(zip(m["row_kind"], m["family"], strict=True))
    )
    batch = rec.batches[0]
    expected = sorted(
        (int(t), int(i), batch["completion_ids"][r].tolist())
        for r, (t, i) in enumerate(zip(batch["row_kind"], batch["family"], strict=True))
    )
    assert seen == expected
    assert batch["family"].tolist() == [0, 1, 2, 3] + [0, 0, 1, 1, 2, 2, 3, 3]


def test_share_prefix_falls_back_with_a_warning(tmp_path, caplog):
    model, tokenizer = tiny_causal_lm()
    model.config._attn_implementation = "flex_attention"
    dataset = Dataset.from_list([{"prompt": [{"role": "user", "content": q}], "solution": s} for q, s in QUESTIONS])
    args = cpu_test_args(
        tmp_path, RLCRMultiTurnConfig, per_device_train_batch_size=4, num_generations=2, num_generations_confidence=2
    )
    with caplog.at_level("WARNING"):
        trainer = RLCRMultiTurnTrainer(model=model, args=args, train_dataset=dataset, processing_class=tokenizer)
    assert not trainer._share_prefix
    assert "share_prefix=True but attn_implementation='flex_attention'" in caplog.text


def test_confidence_turn_old_and_ref_logprobs_are_scored_packed(tmp_path):
    """TRL's old (num_iterations > 1) and reference (beta > 0) log-prob passes of the confidence turn pack the G_c
    siblings of each answer: the same values as scoring the rows one by one."""
    tiny_checkpoint(tmp_path / "model", initializer_range=0.5)  # large weights: attention matters
    batches, packed_calls = {}, {}
    for share_prefix in (True, False):
        trainer = make_trainer(
            tmp_path / str(share_prefix),
            num_iterations=2,
            beta=0.1,
            share_prefix=share_prefix,
            model=str(tmp_path / "model"),
        )
        calls = packed_calls[share_prefix] = {"policy": [], "ref": []}
        for name, module in (("policy", trainer.model), ("ref", trainer.ref_model)):
            module.register_forward_pre_hook(
                lambda m, a, kw, calls=calls[name]: (
                    calls.append(kw["input_ids"].shape) if "shift_labels" in kw else None
                ),
                with_kwargs=True,
            )
        with ScriptedGeneration(trainer, script), BatchRecorder(trainer) as rec:
            trainer.train()
        batches[share_prefix] = rec.batches[0]
    packed, plain = batches[True], batches[False]
    for key in ("old_per_token_logps", "ref_per_token_logps"):
        assert packed[key] is not None
        torch.testing.assert_close(packed[key], plain[key], atol=2e-5, rtol=1e-5)
    assert (packed["old_per_token_logps"] * packed["completion_mask"]).abs().sum() > 1
    # per_device_train_batch_size = 4 rows at a time: the 8 confidence rows go as 2 chunks of 2 packed answers
    # (then the policy's loss forward: 4 families)
    assert [shape[0] for shape in packed_calls[True]["ref"]] == [2, 2]
    assert [shape[0] for shape in packed_calls[True]["policy"]] == [2, 2, 4]
    assert packed_calls[False] == {"policy": [], "ref": []}


def test_confidence_beta_weights_the_kl_of_the_confidence_rows(step, tmp_path):
    """`confidence_beta` is the confidence rows' KL coefficient and `beta` the answer rows': with 0, the loss is TRL's
    with those rows' KL exactly 0 (reference log-probs equal to the policy's), and the answer rows keep theirs."""
    from trl import GRPOTrainer

    _, _, batch, _ = step
    inputs = {k: v for k, v in batch.items() if isinstance(v, torch.Tensor)}
    mask = inputs["completion_mask"]
    checkpoint = str(tiny_checkpoint(tmp_path / "model", initializer_range=0.5))  # beta > 0 loads the reference

    def loss(confidence_beta, ref=None):
        trainer = make_trainer(tmp_path, model=checkpoint, beta=0.1, confidence_beta=confidence_beta)
        trainer.current_gradient_accumulation_steps = 1
        if ref is None:
            return trainer._compute_loss(trainer.model, inputs).item()
        return GRPOTrainer._compute_loss(trainer, trainer.model, {**inputs, "ref_per_token_logps": ref}).item()

    with torch.no_grad():
        ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], dim=1)
        attention = torch.cat([inputs["prompt_mask"], mask], dim=1)
        trainer = make_trainer(tmp_path, model=checkpoint)
        policy, _, _ = GRPOTrainer._get_per_token_logps_and_entropies(
            trainer, trainer.model, ids, attention, mask.size(1)
        )
    noise = torch.randn(mask.shape, generator=torch.Generator().manual_seed(0))
    inputs["ref_per_token_logps"] = policy + 0.5 * noise  # a reference the policy has drifted from
    confidence_rows = (inputs["row_kind"] == 1).unsqueeze(1)
    answers_anchored = torch.where(confidence_rows, policy, inputs["ref_per_token_logps"])

    uniform = loss(None)
    assert loss(0.1) == pytest.approx(uniform, abs=1e-6)
    assert loss(0.0) == pytest.approx(loss(None, ref=answers_anchored), abs=1e-5)
    assert abs(loss(0.0) - uniform) > 1e-3 and abs(loss(0.0) - loss(None, ref=policy)) > 1e-3
    # the KL term is linear in each coefficient
    assert loss(0.2) - loss(0.1) == pytest.approx(loss(0.1) - loss(0.0), abs=1e-5)


@pytest.mark.parametrize("num_iterations", [1, 2])
def test_confidence_beta_0_skips_the_confidence_turns_reference_pass(num_iterations, tmp_path):
    """With no KL term on the confidence rows, the reference model scores the answers only; those rows' reference
    log-probs stay NaN in the batch until each loss forward puts the policy's own there: a KL of exactly 0, a finite
    loss, and the micro-batch kept for the next iteration."""
    checkpoint = str(tiny_checkpoint(tmp_path / "model", initializer_range=0.5))
    trainer = make_trainer(
        tmp_path / "run",
        model=checkpoint,
        beta=0.1,
        confidence_beta=0.0,
        num_iterations=num_iterations,
        max_steps=num_iterations,
    )
    reference_rows, losses = [], []
    trainer.ref_model.register_forward_pre_hook(
        lambda m, a, kw: reference_rows.append(kw["input_ids"].shape[0]), with_kwargs=True
    )
    trainer._compute_loss = lambda model, inputs, f=trainer._compute_loss: (
        losses.append(f(model, inputs)) or losses[-1]
    )
    with ScriptedGeneration(trainer, script), BatchRecorder(trainer) as rec:
        trainer.train()
        kls = [entry["kl"] for entry in trainer.state.log_history if "kl" in entry]
    batch = rec.batches[0]
    confidence_rows = batch["row_kind"] == 1
    assert reference_rows == [4]  # the 4 answers of the one generation batch; none of the 8 confidence rows
    assert torch.isnan(batch["ref_per_token_logps"][confidence_rows]).all()
    assert not torch.isnan(batch["ref_per_token_logps"][~confidence_rows]).any()
    assert len(losses) == num_iterations and all(torch.isfinite(loss) for loss in losses)
    assert kls and all(math.isfinite(kl) for kl in kls)
