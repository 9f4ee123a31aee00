"""Packing rows that share a prefix: layout by hand, and log-probs equal to the row-by-row forward."""

import pytest
import torch
from transformers import GPT2Config, MistralConfig, Qwen2Config
from trl.trainer.utils import add_fused_lm_head

from trl_ext.core.batch import group_rows
from trl_ext.core.prefix_tree import IGNORE_INDEX as X
from trl_ext.core.prefix_tree import pack_prefix_families, tree_attention_mask, tree_mask_unsupported
from trl_ext.testing import tiny_causal_lm


PROMPT_WIDTH, COMPLETION_WIDTH = 6, 3


def rows(*pairs, widths=(PROMPT_WIDTH, COMPLETION_WIDTH)):
    """`[left-padded prompt | right-padded completion]` rows (pad 0) from (prompt, completion) token lists."""
    ids, mask = [], []
    for prompt, completion in pairs:
        p_pad, c_pad = widths[0] - len(prompt), widths[1] - len(completion)
        ids.append([0] * p_pad + prompt + completion + [0] * c_pad)
        mask.append([0] * p_pad + [1] * (len(prompt) + len(completion)) + [0] * c_pad)
    return torch.tensor(ids), torch.tensor(mask)


def test_layout_by_hand():
    # family 7: answer row (prompt 11 12, answer 13 14) and two confidence rows (prompt 11 12 13 14 15, reply ...);
    # family 3: a lone row. The confidence row comes first, as after TRL's shuffle: the root is the shortest prompt.
    ids, mask = rows(
        ([11, 12, 13, 14, 15], [21, 22]), ([11, 12], [13, 14]), ([31], [32]), ([11, 12, 13, 14, 15], [23])
    )
    packed = pack_prefix_families(ids, mask, COMPLETION_WIDTH, torch.tensor([7, 7, 3, 7]), pad_token_id=0)

    # root 11 12 13 14; branches fork at 4 (the row leaves the root after 13 14): 15 21 22 | 15 23
    assert packed.input_ids.tolist() == [[11, 12, 13, 14, 15, 21, 22, 15, 23], [31, 32, 0, 0, 0, 0, 0, 0, 0]]
    assert packed.position_ids.tolist() == [[0, 1, 2, 3, 4, 5, 6, 4, 5], [0, 1, 0, 0, 0, 0, 0, 0, 0]]
    assert packed.shift_labels.tolist() == [[X, 13, 14, X, 21, 22, X, 23, X], [32, X, X, X, X, X, X, X, X]]
    a = packed.attend[0].int()
    assert a[4].tolist() == [1, 1, 1, 1, 1, 0, 0, 0, 0]  # first branch token: the root before the fork, itself
    assert a[7].tolist() == [1, 1, 1, 1, 0, 0, 0, 1, 0]  # second branch: never the first branch
    assert a[8].tolist() == [1, 1, 1, 1, 0, 0, 0, 1, 1]
    assert a[3].tolist() == [1, 1, 1, 1, 0, 0, 0, 0, 0]  # root: causal
    assert packed.attend[1, 5].int().tolist() == [0, 0, 1, 1, 1, 1, 0, 0, 0]  # padding sees padding only

    values = torch.arange(18.0).view(2, 9)
    # row 0: 21 22 predicted at packed 4 5; row 1: 13 14 at 1 2; row 2: 32 at (1, 0); row 3: 23 at 7
    assert packed.unpack(values, 4, COMPLETION_WIDTH).tolist() == [[4, 5, 0], [1, 2, 0], [9, 0, 0], [7, 0, 0]]


def test_branch_starts_no_later_than_its_first_prediction():
    # the confidence row's prompt equals the root's whole sequence: its first reply token is predicted by the root's
    # last token, which also has to predict nothing for the root; the branch repeats that token
    ids, mask = rows(([11, 12], [13, 14]), ([11, 12, 13, 14], [21]))
    packed = pack_prefix_families(ids, mask, COMPLETION_WIDTH, torch.tensor([0, 0]), pad_token_id=0)
    assert packed.input_ids.tolist() == [[11, 12, 13, 14, 14, 21]]
    assert packed.position_ids.tolist() == [[0, 1, 2, 3, 3, 4]]
    assert packed.shift_labels.tolist() == [[X, 13, 14, X, 21, X]]
    assert packed.attend[0, 4].int().tolist() == [1, 1, 1, 0, 1, 0]


def test_rows_without_shared_prefix_and_empty_prompts():
    ids, mask = rows(([1, 2], [3]), ([4, 5], [6]))
    packed = pack_prefix_families(ids, mask, COMPLETION_WIDTH, torch.tensor([0, 0]), pad_token_id=0)
    assert packed.input_ids.tolist() == [[1, 2, 3, 4, 5, 6]]
    assert packed.position_ids.tolist() == [[0, 1, 2, 0, 1, 2]]
    assert not packed.attend[0, 3:, :3].any()
    ids, mask = rows(([], [3, 4]))
    with pytest.raises(ValueError, match="no prompt token"):
        pack_prefix_families(ids, mask, COMPLETION_WIDTH, torch.tensor([0]), pad_token_id=0)


def sharp_model(implementation):
    """A tiny model whose attention matters (large random weights), so a wrong mask changes the log-probs."""
    model, _ = tiny_causal_lm(hidden_size=32, initializer_range=0.5)
    model.config._attn_implementation = implementation
    add_fused_lm_head(model, outputs=("log_probs", "entropy"))
    return model


def family_batch(seed=0):
    """Two answer families as in RLCR (answer row, two confidence rows), shuffled, plus padding everywhere."""
    g = torch.Generator().manual_seed(seed)

    def tokens(n):
        return torch.randint(5, 400, (n,), generator=g).tolist()

    pairs, family = [], []
    for f, (p, a) in enumerate([(5, 4), (3, 6)]):
        prompt, answer, suffix = tokens(p), tokens(a), tokens(3)
        pairs += [(prompt, answer), (prompt + answer + suffix, tokens(3)), (prompt + answer + suffix, tokens(2))]
        family += [f] * 3
    order = [4, 0, 2, 5, 1, 3]
    ids, mask = rows(*[pairs[i] for i in order], widths=(14, 6))
    return ids, mask, torch.tensor([family[i] for i in order])


@pytest.mark.parametrize("implementation", ["sdpa", "eager"])
def test_packed_forward_equals_row_by_row_forward(implementation):
    model = sharp_model(implementation)
    ids, mask, family = family_batch()
    width = 6
    labels = ids.masked_fill(mask == 0, X)
    labels[:, :-width] = X
    reference = model(input_ids=ids, attention_mask=mask, labels=labels, fused_lm_head=True)

    def packed_forward(attend_fn=lambda a: a):
        packed = pack_prefix_families(ids, mask, width, family, pad_token_id=0)
        out = model(
            input_ids=packed.input_ids,
            position_ids=packed.position_ids,
            attention_mask=tree_attention_mask(attend_fn(packed.attend), implementation),
            shift_labels=packed.shift_labels,
            fused_lm_head=True,
        )
        return packed.unpack(out.log_probs, ids.size(0), width), packed.unpack(out.entropy, ids.size(0), width)

    logps, entropy = packed_forward()
    torch.testing.assert_close(logps, reference.log_probs[:, -width:], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(entropy, reference.entropy[:, -width:], atol=1e-5, rtol=1e-5)
    assert (
        packed_forward()[0].shape == (6, width)
        and (reference.log_probs[:, -width:] != 0).sum() == mask[:, -width:].sum()
    )

    # the comparison can fail: plain causal attention over the packed sequence lets a branch see its siblings
    causal = torch.ones_like(pack_prefix_families(ids, mask, width, family, 0).attend).tril()
    wrong, _ = packed_forward(lambda a: causal)
    assert (wrong - reference.log_probs[:, -width:]).abs().max() > 1e-2

    # gradients flow through the packing to the same parameters, with the same values
    model.zero_grad()
    (logps * mask[:, -width:]).sum().backward()
    packed_grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    (reference.log_probs[:, -width:] * mask[:, -width:]).sum().backward()
    # rtol 1e-3: the two backward passes sum the tied embedding's gradient (values near 1 on this sharp model) over
    # positions in different orders, a few 1e-4 apart in float32
    for a, b in zip(packed_grads, [p.grad for p in model.parameters()], strict=True):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-3)


def test_which_models_take_a_tree_mask():
    model, _ = tiny_causal_lm()
    assert tree_mask_unsupported(model.config) is None
    model.config._attn_implementation = "flash_attention_2"
    assert "flash_attention_2" in tree_mask_unsupported(model.config)
    qwen = Qwen2Config()  # sliding window configured but off
    qwen._attn_implementation = "sdpa"
    assert tree_mask_unsupported(qwen) is None
    mistral = MistralConfig(sliding_window=4096)
    mistral._attn_implementation = "sdpa"
    assert "sliding-window" in tree_mask_unsupported(mistral)
    gpt2 = GPT2Config()
    gpt2._attn_implementation = "eager"
    assert "rotary" in tree_mask_unsupported(gpt2)


def test_group_rows_keeps_chunks_and_brings_families_together():
    chunks = [
        {"id": torch.tensor([2, 0, 1]), "text": ["c", "a", "b"], "n": torch.tensor(9), "none": None},
        {"id": torch.tensor([0, 2, 1]), "text": ["a2", "c2", "b2"], "n": torch.tensor(9), "none": None},
    ]
    out = group_rows(chunks, "id")
    assert [c["id"].tolist() for c in out] == [[2, 2, 0], [0, 1, 1]]
    assert [c["text"] for c in out] == [["c", "c2", "a"], ["a2", "b", "b2"]]
    assert all(c["n"].item() == 9 and c["none"] is None for c in out)


def test_family_chunks_keep_families_whole():
    from trl_ext.core.prefix_tree import family_chunks

    family = torch.tensor([0, 0, 1, 1, 2, 2, 3, 3, 3])
    assert [c.tolist() for c in family_chunks(family, 4)] == [[0, 1, 2, 3], [4, 5], [6, 7, 8]]
    assert [c.tolist() for c in family_chunks(family, 2)] == [[0, 1], [2, 3], [4, 5], [6, 7, 8]]  # one too large
    assert [c.tolist() for c in family_chunks(torch.tensor([5, 1, 5]), 9)] == [[0, 2, 1]]  # by first appearance
