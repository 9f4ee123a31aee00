"""Runs under torchrun: a scripted RLCR step with `answer_refill_rounds=3`; reports per rank the generation calls, the
answer rows of the batch and the metrics.

Four prompts of G_a = 2 answers. With 2 ranks of 4 answer rows, rank 0 holds A and B, rank 1 C and D:
- A: both wrong, then mixed (round 1): replaced.    B: both right in every call: kept.
- C: mixed from the start.                          D: both wrong, both wrong (round 1), mixed (round 2): replaced.
Rank 0 has two all-equal groups and rank 1 one; after round 2 only rank 0 has one (B), so in round 3 rank 1 has
none and regenerates one of its own groups as a filler. Answers depend on the call (first sampling, round 1, ...),
so one process with all eight rows builds the same batch.
"""

import os
import tempfile

from datasets import Dataset

from trl_ext.testing import BatchRecorder, ScriptedGeneration, cpu_test_args, tiny_causal_lm, write_rank_result
from trl_ext.trainers import RLCRMultiTurnConfig, RLCRMultiTurnTrainer


CONFIDENCE_PROMPT = "Confidence? Reply <confidence>p</confidence>."
GOLD = {"A": "1", "B": "2", "C": "3", "D": "4"}
MIXED_FROM_CALL = {"A": 1, "B": None, "C": 0, "D": 2}  # the first call whose answers are mixed (None: never)


def main():
    model, tokenizer = tiny_causal_lm()
    dataset = Dataset.from_list(
        [{"prompt": [{"role": "user", "content": f"Question {q}?"}], "solution": gold} for q, gold in GOLD.items()]
    )
    world = int(os.environ["WORLD_SIZE"])
    refused = None
    if world == 2:  # every prompt's 4 answers would span both ranks
        try:
            cpu_test_args(
                tempfile.mkdtemp(),
                RLCRMultiTurnConfig,
                per_device_train_batch_size=2,
                num_generations=4,
                answer_refill_rounds=1,
            )
        except ValueError as error:
            refused = str(error)
    args = cpu_test_args(
        tempfile.mkdtemp(),
        RLCRMultiTurnConfig,
        max_steps=1,
        per_device_train_batch_size=8 // world,
        num_generations=2,
        num_generations_confidence=2,
        confidence_prompt=CONFIDENCE_PROMPT,
        shuffle_dataset=False,
        max_completion_length=16,
        max_confidence_length=12,
        answer_refill_rounds=3,
    )
    trainer = RLCRMultiTurnTrainer(model=model, args=args, train_dataset=dataset, processing_class=tokenizer)

    def script(prompt_text, k):
        if CONFIDENCE_PROMPT in prompt_text:
            return ["<confidence>0.3</confidence>", "<confidence>0.8</confidence>"][k]
        question = next(q for q in GOLD if f"Question {q}?" in prompt_text)
        call = len(gen.calls)  # 0: the first sampling, r: refill round r
        mixed = MIXED_FROM_CALL[question] is not None and call >= MIXED_FROM_CALL[question]
        right = (k == 0) if mixed else question == "B"
        return f"<think>call {call}</think><answer>{GOLD[question] if right else 0}</answer>"

    with ScriptedGeneration(trainer, script) as gen, BatchRecorder(trainer) as rec:
        trainer.train()
    batch = rec.batches[0]
    answers = (batch["row_kind"] == 0).nonzero().flatten().tolist()
    texts = [
        tokenizer.decode(batch["completion_ids"][row][batch["completion_mask"][row].bool()], skip_special_tokens=True)
        for row in answers
    ]
    log = trainer.state.log_history[0]
    write_rank_result(
        {
            "world_size": trainer.accelerator.num_processes,
            "calls": [len(call.prompt_ids) for call in gen.calls],
            "answers": texts,
            "answer_advantages": batch["advantages"][answers].tolist(),
            "metrics": {k: v for k, v in log.items() if "refill" in k or k.startswith(("answer/frac", "frac"))},
            "accuracy": log["answer/accuracy"],
            "refused": refused,
        }
    )


if __name__ == "__main__":
    main()
