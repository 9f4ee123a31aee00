"""Multi-process invariants checked in one process (docs/design.md#multi-process-invariants): every process makes the
same forward and backward passes, whatever rows it holds. The two-process runs are in test_sharded_multiprocess.py."""

from unittest import mock

import pytest
import torch
from datasets import Dataset
from trl import GRPOTrainer

from trl_ext.testing import cpu_test_args, tiny_causal_lm
from trl_ext.trainers import RLCRMultiTurnConfig, RLCRMultiTurnTrainer
from trl_ext.trainers.seams.row_kind_forwards import ForwardRows
from trl_ext.trainers.seams.scoping import scoped_call


def rlcr_trainer(tmp_path, model):
    dataset = Dataset.from_list([{"prompt": [{"role": "user", "content": "What is 1+2?"}], "solution": "3"}])
    args = cpu_test_args(
        tmp_path,
        RLCRMultiTurnConfig,
        per_device_train_batch_size=4,
        num_generations=2,
        num_generations_confidence=2,
        share_prefix=False,
    )
    return RLCRMultiTurnTrainer(model=model, args=args, train_dataset=dataset, processing_class=tiny_causal_lm()[1])


@pytest.mark.parametrize(
    "types",
    [[1, 1, 1, 1, 1, 1], [0, 0, 1, 1, 1, 1], [0, 0, 0, 0, 0, 0]],
    ids=["confidences-only", "both", "answers-only"],
)
def test_rlcr_split_loss_forward_is_the_same_on_every_process(tmp_path, types):
    """Without share_prefix, with several processes, the loss forward scores each row kind in a forward of its own
    even where the micro-batch lacks it (a stand-in row joined at weight zero), so every process makes two forwards
    and two backwards; the log-probs are those of one plain forward."""
    model, _ = tiny_causal_lm(initializer_range=0.5)
    trainer = rlcr_trainer(tmp_path, model)
    generator = torch.Generator().manual_seed(0)
    input_ids = torch.randint(0, 1000, (6, 12), generator=generator)
    attention_mask = torch.ones_like(input_ids)
    attention_mask[4:, :3] = 0  # left padding on two prompts
    attention_mask[:2, -2:] = 0  # right padding on two completions
    forwards, backwards = [], []
    model.register_forward_pre_hook(lambda m, a, kw: forwards.append(kw["input_ids"].shape), with_kwargs=True)
    model.model.layers[0].register_full_backward_hook(lambda m, gi, go: backwards.append(1))
    expected, _, _ = GRPOTrainer._get_per_token_logps_and_entropies(trainer, model, input_ids, attention_mask, 5)
    two = mock.PropertyMock(return_value=2)
    for processes, counts in ((1, len(set(types))), (2, 2)):
        forwards.clear()
        backwards.clear()
        model.zero_grad()
        with (
            mock.patch.object(type(trainer.accelerator), "num_processes", two) if processes == 2 else mock.MagicMock()
        ):
            with scoped_call(trainer, _forward_rows=ForwardRows(torch.tensor(types))):
                logps, entropies, _ = trainer._get_per_token_logps_and_entropies(
                    model, input_ids, attention_mask, 5, compute_entropy=True
                )
        ((logps * attention_mask[:, -5:]).sum() + entropies.sum()).backward()
        assert len(forwards) == counts and len(backwards) == counts, processes
        torch.testing.assert_close(
            logps * attention_mask[:, -5:], expected * attention_mask[:, -5:], atol=1e-5, rtol=1e-5
        )
        assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())
