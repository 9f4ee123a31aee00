"""Advantage post-processing and row-batch concatenation against hand-computed values."""

import pytest
import torch

from trl_ext.core.advantages import group_advantages
from trl_ext.core.batch import concat_row_batches


def test_prompt_level_normalize_by_hand():
    values = torch.tensor([0.1, -0.1, 0.3, -0.3, 0.0, 0.0, 0.0, 0.0])  # two prompts of 4 rows
    out = group_advantages(values, group_size=4)
    std = torch.tensor([0.1, -0.1, 0.3, -0.3]).std()  # unbiased: sqrt((0.01+0.01+0.09+0.09)/3) = sqrt(0.2/3)
    assert std.item() == pytest.approx((0.2 / 3) ** 0.5)
    torch.testing.assert_close(out[:4], torch.tensor([0.1, -0.1, 0.3, -0.3]) / (std + 1e-4))
    assert out[4:].tolist() == [0.0] * 4  # a constant prompt gets zero, not NaN
    with pytest.raises(ValueError, match="groups of 3"):
        group_advantages(values, group_size=3)


def test_not_applicable_rewards_stay_out_of_the_statistics():
    # NaN (TRL's None: e.g. confidences of an answer without a gold answer) takes no part in mean or std and gets 0.
    nan = float("nan")
    values = torch.tensor([1.0, nan, 0.0, 0.5, nan, nan, nan, nan])
    out = group_advantages(values, group_size=4)
    # mean of (1, 0, 0.5) = 0.5; unbiased std = sqrt((0.25 + 0.25 + 0) / 2) = 0.5
    torch.testing.assert_close(out[:4], torch.tensor([0.5, 0.0, -0.5, 0.0]) / (0.5 + 1e-4))
    assert out[4:].tolist() == [0.0] * 4  # a group with nothing scored
    torch.testing.assert_close(group_advantages(values, 4, "none")[:4], torch.tensor([0.5, 0.0, -0.5, 0.0]))
    torch.testing.assert_close(
        group_advantages(values, 4, "batch")[:4], torch.tensor([0.5, 0.0, -0.5, 0.0]) / (0.5 + 1e-4)
    )
    assert not torch.isnan(group_advantages(torch.full((4,), nan), 2, "batch")).any()


def test_concat_pads_prompts_left_and_completions_right():
    a = {
        "prompt_ids": torch.tensor([[5, 6]]),
        "prompt_mask": torch.tensor([[1, 1]]),
        "completion_ids": torch.tensor([[7, 8, 9]]),
        "completion_mask": torch.tensor([[1, 1, 1]]),
        "old_per_token_logps": torch.tensor([[-1.0, -2.0, -3.0]]),
        "advantages": torch.tensor([0.5]),
        "num_items_in_batch": torch.tensor(3),
    }
    b = {
        "prompt_ids": torch.tensor([[1, 2, 3, 4]]),
        "prompt_mask": torch.tensor([[1, 1, 1, 1]]),
        "completion_ids": torch.tensor([[3]]),
        "completion_mask": torch.tensor([[1]]),
        "old_per_token_logps": torch.tensor([[-0.5]]),
        "advantages": torch.tensor([-1.0]),
        "num_items_in_batch": torch.tensor(1),
    }
    out = concat_row_batches([a, b], pad_token_id=0)
    assert out["prompt_ids"].tolist() == [[0, 0, 5, 6], [1, 2, 3, 4]]
    assert out["prompt_mask"].tolist() == [[0, 0, 1, 1], [1, 1, 1, 1]]
    assert out["completion_ids"].tolist() == [[7, 8, 9], [3, 0, 0]]
    assert out["completion_mask"].tolist() == [[1, 1, 1], [1, 0, 0]]
    assert out["old_per_token_logps"].tolist() == [[-1.0, -2.0, -3.0], [-0.5, 0.0, 0.0]]
    assert out["advantages"].tolist() == [0.5, -1.0]
    assert "num_items_in_batch" not in out  # must be recomputed for the union


def test_concat_rejects_mismatched_keys():
    with pytest.raises(ValueError, match="different keys"):
        concat_row_batches([{"advantages": torch.zeros(1)}, {"x": torch.zeros(1)}], pad_token_id=0)


def test_trim_padding_drops_columns_no_row_uses():
    from trl_ext.core.batch import trim_padding

    # prompt width 4 (left-padded), completion width 3 (right-padded)
    ids = torch.tensor([[0, 0, 5, 6, 7, 8, 0], [0, 0, 0, 9, 1, 0, 0]])
    mask = torch.tensor([[0, 0, 1, 1, 1, 1, 0], [0, 0, 0, 1, 1, 0, 0]])
    out_ids, out_mask, keep = trim_padding(ids, mask, 3)
    assert keep == 2
    assert out_ids.tolist() == [[5, 6, 7, 8], [0, 9, 1, 0]]
    assert out_mask.tolist() == [[1, 1, 1, 1], [0, 1, 1, 0]]
    # all completion columns empty: one column stays
    assert trim_padding(ids, torch.tensor([[0, 0, 1, 1, 0, 0, 0]] * 2), 3)[2] == 1


def test_merge_rows_restores_order_and_width():
    from trl_ext.core.batch import merge_rows

    first = (torch.tensor([[1.0, 2.0]]), None)
    second = (torch.tensor([[3.0], [4.0]]), None)
    logps, entropies = merge_rows([first, second], [torch.tensor([1]), torch.tensor([2, 0])], width=3)
    assert logps.tolist() == [[4.0, 0.0, 0.0], [1.0, 2.0, 0.0], [3.0, 0.0, 0.0]]
    assert entropies is None


def test_scatter_rows_puts_parts_in_place_and_zeros_elsewhere():
    from trl_ext.core.batch import scatter_rows

    values = torch.tensor([[1.0, 2.0]], requires_grad=True)
    out = scatter_rows(
        [(torch.tensor([2]), values), (torch.tensor([0]), torch.tensor([[3.0, 4.0, 5.0]]))], 4, 3, "cpu"
    )
    assert out.tolist() == [[3.0, 4.0, 5.0], [0.0, 0.0, 0.0], [1.0, 2.0, 0.0], [0.0, 0.0, 0.0]]
    out.sum().backward()
    assert values.grad.tolist() == [[1.0, 1.0]]
    assert scatter_rows([], 2, 3, "cpu").tolist() == [[0.0] * 3] * 2
