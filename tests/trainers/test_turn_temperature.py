"""Per-turn sampling temperature stays on-policy: a turn sampled at its own temperature (RLCR's
`confidence_temperature`, Absolute Zero's `proposer_temperature`) has its old, reference and loss log-probs computed
at that temperature, so vLLM's importance-sampling ratio is 1 on every row kind; a temperature in a turn's generation
kwargs, which would not reach the log-probs, is refused."""

import pytest
import torch
from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoTokenizer
from trl.trainer.utils import add_fused_lm_head

from trl_ext.models.logprob_tiles import FusedHeadTemperatures
from trl_ext.testing import (
    BatchRecorder,
    LoopbackVLLMServer,
    ScriptedGeneration,
    cpu_test_args,
    tiny_causal_lm,
    tiny_checkpoint,
    vllm_server_mode,
)
from trl_ext.trainers import AbsoluteZeroConfig, AbsoluteZeroTrainer, RLCRMultiTurnConfig, RLCRMultiTurnTrainer
from trl_ext.trainers.absolute_zero_trainer import PROPOSER, SOLVER
from trl_ext.trainers.rlcr_trainer import ANSWER, CONFIDENCE


ANSWER_T, SECOND_T = 0.5, 1.5  # the main turn's temperature, and the confidence turn's / proposer's


def rlcr_dataset(n=4):
    return Dataset.from_list(
        [{"prompt": [{"role": "user", "content": f"What is {i}+{i}?"}], "solution": str(2 * i)} for i in range(n)]
    )


def seed_dataset(n=4):
    return Dataset.from_list([{"prompt": [{"role": "user", "content": f"Propose task {i}"}]} for i in range(n)])


def parity(prompts, completions, completion_ids, **kwargs):
    return [float(ids[0] % 2) if ids else 0.0 for ids in completion_ids]


def server_args(server):
    return dict(
        use_vllm=True,
        vllm_mode="server",
        vllm_server_base_url=server.base_url,
        vllm_importance_sampling_mode="token_truncate",
        temperature=ANSWER_T,
        max_steps=2,
    )


def rlcr(tmp_path, model, tokenizer, **overrides):
    args = cpu_test_args(
        tmp_path,
        RLCRMultiTurnConfig,
        **{
            **dict(
                per_device_train_batch_size=4,
                num_generations=2,
                num_generations_confidence=2,
                max_completion_length=10,
                max_confidence_length=8,
            ),
            **overrides,
        },
    )
    return RLCRMultiTurnTrainer(model=model, args=args, train_dataset=rlcr_dataset(), processing_class=tokenizer)


def absolute_zero(tmp_path, model, tokenizer, **overrides):
    args = cpu_test_args(
        tmp_path,
        AbsoluteZeroConfig,
        **{
            **dict(
                per_device_train_batch_size=4,
                num_generations=2,
                num_questions_per_prompt=2,
                max_repropose_attempts=0,
                max_completion_length=6,
                max_question_length=6,
            ),
            **overrides,
        },
    )
    return AbsoluteZeroTrainer(
        model,
        [parity],
        args=args,
        train_dataset=seed_dataset(),
        processing_class=tokenizer,
        parse_question=lambda text: {"question": f"Repeat: {text[:12]}"},
    )


def checkpoint(tmp_path):
    """A tiny model on disk (`beta > 0` loads the reference model from its path) and the server's copy of it; a
    large initialisation makes the log-probs depend on the temperature measurably."""
    path = tiny_checkpoint(tmp_path / "model", initializer_range=0.5)
    return path, AutoModelForCausalLM.from_pretrained(path), AutoTokenizer.from_pretrained(path)


def ratio_deviation(batch, kinds):
    """Largest |IS ratio - 1| over the completion tokens of the rows of `kinds`, from TRL's own ratio."""
    rows = torch.isin(batch["row_kind"], torch.tensor(kinds))
    mask = batch["completion_mask"][rows].bool()
    return (batch["importance_sampling_ratio"][rows][mask] - 1).abs().max().item()


def base_temperature_deviation(trainer, batch, kind):
    """Largest |log-prob at the main turn's temperature - sampling log-prob| over `kind`'s rows: how far off-policy
    the rows would be if scored at TRL's one temperature (the test's control: the temperatures must matter)."""
    rows = torch.nonzero(batch["row_kind"] == kind).flatten()
    ids = torch.cat([batch["prompt_ids"][rows], batch["completion_ids"][rows]], dim=1)
    mask = torch.cat([batch["prompt_mask"][rows], batch["completion_mask"][rows]], dim=1)
    width = batch["completion_ids"].size(1)
    with torch.no_grad():
        logps, _, _ = trainer._get_per_token_logps_and_entropies(trainer.model, ids, mask, width)
    completion = batch["completion_mask"][rows].bool()
    return (logps - batch["sampling_per_token_logps"][rows])[completion].abs().max().item()


def test_rlcr_confidence_temperature_is_on_policy_through_the_vllm_server(tmp_path):
    path, model, tokenizer = checkpoint(tmp_path)
    with LoopbackVLLMServer(model, tokenizer) as server, vllm_server_mode(server):
        trainer = rlcr(tmp_path, path, None, confidence_temperature=SECOND_T, beta=0.1, **server_args(server))
        with BatchRecorder(trainer) as rec:
            trainer.train()

    bodies = [request["body"] for request in server.requests]
    assert [body["temperature"] for body in bodies] == [ANSWER_T, SECOND_T] * 2  # answers, confidences per step
    for batch in rec.batches:
        assert ratio_deviation(batch, [ANSWER]) < 1e-3
        assert ratio_deviation(batch, [CONFIDENCE]) < 1e-3
    for log in trainer.state.log_history[:-1]:
        for prefix in ("", "confidence/"):
            for stat in ("min", "max"):
                assert abs(log[f"{prefix}sampling/importance_sampling_ratio/{stat}"] - 1) < 1e-3
    # Control: the confidences' own log-probs at the answer temperature are far from what they were sampled with.
    assert base_temperature_deviation(trainer, rec.batches[-1], CONFIDENCE) > 0.05


@pytest.mark.parametrize("share_prefix", [True, False], ids=["packed", "by-row"])
def test_rlcr_loss_forward_scores_each_kind_at_its_temperature(tmp_path, share_prefix):
    """With vLLM's ratio at 1 the sampling log-probs are exact; the loss forward must give the same ones per kind,
    packed by family or row by row."""
    model, tokenizer = tiny_causal_lm(initializer_range=0.5)
    with LoopbackVLLMServer(model, tokenizer) as server, vllm_server_mode(server):
        trainer = rlcr(
            tmp_path,
            model,
            tokenizer,
            confidence_temperature=SECOND_T,
            share_prefix=share_prefix,
            learning_rate=0.0,
            **{**server_args(server), "max_steps": 1},
        )
        with BatchRecorder(trainer) as rec:
            trainer.train()
    batch = rec.batches[0]
    logps = []
    original = trainer._get_per_token_logps_and_entropies

    def spy(*args, **kwargs):
        out = original(*args, **kwargs)
        logps.append(out[0].detach())
        return out

    trainer._get_per_token_logps_and_entropies = spy
    trainer._compute_loss(trainer.model, batch)
    mask = batch["completion_mask"].bool()
    torch.testing.assert_close(logps[0][mask], batch["sampling_per_token_logps"][mask], atol=1e-4, rtol=0)


def test_absolute_zero_proposer_temperature_is_on_policy_through_the_vllm_server(tmp_path):
    path, model, tokenizer = checkpoint(tmp_path)
    with LoopbackVLLMServer(model, tokenizer) as server, vllm_server_mode(server):
        trainer = absolute_zero(tmp_path, path, None, proposer_temperature=SECOND_T, beta=0.1, **server_args(server))
        with BatchRecorder(trainer) as rec:
            trainer.train()

    bodies = [request["body"] for request in server.requests]
    assert [body["temperature"] for body in bodies] == [SECOND_T, ANSWER_T] * 2  # proposer, solver per step
    for batch in rec.batches:
        live = batch["tool_mask"].sum(-1) > 0  # padding proposer rows repeat a real one: the same ratio
        assert live.any()
        assert ratio_deviation(batch, [SOLVER]) < 1e-3
        assert ratio_deviation(batch, [PROPOSER]) < 1e-3
    for log in trainer.state.log_history[:-1]:
        for prefix in ("", "proposer/"):
            for stat in ("min", "max"):
                assert abs(log[f"{prefix}sampling/importance_sampling_ratio/{stat}"] - 1) < 1e-3
    assert base_temperature_deviation(trainer, rec.batches[-1], PROPOSER) > 0.05


@pytest.mark.parametrize(
    "device",
    ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA"))],
)
def test_fused_head_log_probs_are_the_log_softmax_at_the_kind_temperature(device):
    """On CUDA, TRL's Triton kernel scores the labelled positions: the same check there."""
    model, _ = tiny_causal_lm(initializer_range=0.5)
    model.to(device)
    add_fused_lm_head(model, temperature=ANSWER_T, outputs=("log_probs", "entropy"))
    heads = FusedHeadTemperatures([(model, ("log_probs", "entropy"))], ANSWER_T, cast_lm_head_to_fp32=False)
    ids = torch.randint(0, 1000, (2, 12), device=device)
    labels = ids.clone()
    labels[:, :6] = -100

    def fused():
        return model(input_ids=ids, labels=labels, fused_lm_head=True).log_probs[:, 5:]

    with torch.no_grad():
        logits = model(input_ids=ids).logits[:, 5:-1]  # unfused: generation's path, through every head
        expected = {
            t: torch.log_softmax(logits / t, dim=-1).gather(-1, ids[:, 6:, None]).squeeze(-1)
            for t in (ANSWER_T, SECOND_T)
        }
        at_base = fused()
        with heads.at(SECOND_T):
            at_second = fused()
            assert torch.equal(model(input_ids=ids).logits[:, 5:-1], logits)  # generation is unchanged
        after = fused()
    close = dict(atol=1e-4, rtol=1e-4)  # the Triton kernel's float32 sums, on CUDA
    torch.testing.assert_close(at_base, expected[ANSWER_T], **close)
    torch.testing.assert_close(at_second, expected[SECOND_T], **close)
    torch.testing.assert_close(after, expected[ANSWER_T], **close)  # restored
    assert (expected[SECOND_T] - expected[ANSWER_T]).abs().max() > 0.1  # the temperatures differ measurably


def test_kind_temperatures_in_the_loss_forward(tmp_path):
    """`_forward_by_kind` scores each kind at its temperature: equal to log_softmax(logits / T_kind), gathered."""
    model, tokenizer = tiny_causal_lm(initializer_range=0.5)
    trainer = rlcr(tmp_path, model, tokenizer, temperature=ANSWER_T, confidence_temperature=SECOND_T, max_steps=1)
    ids = torch.randint(0, 1000, (4, 10))
    mask = torch.ones_like(ids)
    kinds = torch.tensor([ANSWER, CONFIDENCE, ANSWER, CONFIDENCE])
    with torch.no_grad():
        logps, _ = trainer._forward_by_kind(trainer.model, ids, mask, 4, None, False, kinds)
        logits = trainer.model(input_ids=ids).logits[:, -5:-1]
    temperature = torch.where(kinds == CONFIDENCE, SECOND_T, ANSWER_T)[:, None, None]
    expected = torch.log_softmax(logits / temperature, dim=-1).gather(-1, ids[:, -4:, None]).squeeze(-1)
    torch.testing.assert_close(logps, expected)


@pytest.mark.parametrize(
    "config, field, fix",
    [
        (RLCRMultiTurnConfig, "confidence_generation_kwargs", "confidence_temperature"),
        (RLCRMultiTurnConfig, "generation_kwargs", "temperature"),
        (AbsoluteZeroConfig, "proposer_generation_kwargs", "proposer_temperature"),
        (AbsoluteZeroConfig, "generation_kwargs", "temperature"),
    ],
)
def test_a_temperature_in_generation_kwargs_is_refused(tmp_path, config, field, fix):
    with pytest.raises(ValueError, match=rf"{field}\['temperature'\].*set {fix} instead"):
        cpu_test_args(tmp_path, config, **{field: {"temperature": 1.5}})


@pytest.mark.parametrize(
    "config, field", [(RLCRMultiTurnConfig, "confidence_temperature"), (AbsoluteZeroConfig, "proposer_temperature")]
)
@pytest.mark.parametrize("value", [0.0, -1.0, float("inf")])
def test_a_turn_temperature_must_be_positive(tmp_path, config, field, value):
    with pytest.raises(ValueError, match=field):
        cpu_test_args(tmp_path, config, **{field: value})


def test_transformers_generation_samples_each_turn_at_its_temperature(tmp_path):
    model, tokenizer = tiny_causal_lm()
    trainer = rlcr(tmp_path, model, tokenizer, temperature=ANSWER_T, confidence_temperature=SECOND_T, max_steps=1)
    sampled = []

    def script(prompt_text, k):
        second_turn = "confidence" in prompt_text.split("<|im_start|>user")[-1]
        sampled.append((second_turn, trainer.generation_config.temperature))
        return "<confidence>0.5</confidence>" if second_turn else "<answer>1</answer>"

    with ScriptedGeneration(trainer, script):
        trainer.train()
    assert {t for second, t in sampled if not second} == {ANSWER_T}
    assert {t for second, t in sampled if second} == {SECOND_T}
    assert trainer.generation_config.temperature == ANSWER_T  # the answer turn's settings are back
