"""The tail after a closing tag (single-turn RLCR's confidence part), on hand-computed character spans and on
SmolLM2's byte-level BPE, where the tag's `>` merges with what follows."""

from trl_ext.core.tail_spans import tail_token_mask, tokens_after_tag
from trl_ext.testing import tiny_tokenizer


def test_tokens_after_the_last_tag_by_hand():
    text = "<answer>7</answer><confidence>0.8</confidence>"  # </answer> ends at character 18
    spans = [(0, 8), (8, 9), (9, 17), (17, 18), (18, 30), (30, 33), (33, 46), (46, 46)]
    assert tokens_after_tag(spans, text, "</answer>") == [0, 0, 0, 0, 1, 1, 1, 1]
    # a token straddling the tag's end ('>' plus the next '<') keeps the KL of the answer
    straddle = [(0, 17), (17, 19), (19, 46)]
    assert tokens_after_tag(straddle, text, "</answer>") == [0, 0, 1]
    # the last closing tag ends the answer
    twice = "<answer>1</answer><answer>2</answer> <confidence>1</confidence>"
    assert tokens_after_tag([(0, 18), (18, 36), (36, 37), (37, 63)], twice, "</answer>") == [0, 0, 1, 1]
    # no closing tag: nothing is the tail; nothing after it: an empty tail
    assert tokens_after_tag([(0, 5), (5, 9)], "7 0.8", "</answer>") == [0, 0]
    assert tokens_after_tag([(0, 9), (9, 18)], "<answer>7</answer>", "</answer>") == [0, 0]
    assert tokens_after_tag([], "", "</answer>") == []


def test_tail_mask_on_merged_tag_tokens():
    tok = tiny_tokenizer()
    ids = tok.encode("<answer>42</answer><confidence>0.7</confidence>", add_special_tokens=False)
    ids = ids + [tok.eos_token_id]
    pieces = [tok.decode([i]) for i in ids]
    assert pieces[:8] == ["<", "answer", ">", "4", "2", "</", "answer", "><"]  # '><' straddles the tag's end
    # the answer through '><' keeps its KL; 'confidence', '>', '0', '.', '7', '</', 'confidence', '>' and EOS do not
    assert tail_token_mask(tok, ids, "</answer>") == [0] * 8 + [1] * 9
    assert tail_token_mask(tok, ids[:-1], "</answer>") == [0] * 8 + [1] * 8
    assert tail_token_mask(tok, ids, "</think>") == [0] * 17
