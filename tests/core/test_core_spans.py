"""Span masks on token ids with SmolLM2's byte-level BPE tokenizer, where tags merge with their neighbours."""

import pytest

from trl_ext.core.spans import locate_span, span_token_mask, token_char_spans
from trl_ext.testing import tiny_tokenizer


@pytest.fixture(scope="module")
def tok():
    return tiny_tokenizer()


def pieces(tok, ids):
    return [tok.decode([i]) for i in ids]


def test_char_spans_cover_the_text(tok):
    ids = tok.encode("Let me see.<think>2+2</think>", add_special_tokens=False)
    text, spans = token_char_spans(tok, ids)
    assert text == tok.decode(ids)
    assert spans[0][0] == 0 and spans[-1][1] == len(text)
    assert all(a[1] == b[0] for a, b in zip(spans, spans[1:]))  # contiguous
    assert [text[a:b] for a, b in spans] == pieces(tok, ids)


def test_multibyte_characters_split_over_tokens_share_a_span(tok):
    ids = tok.encode("héllo 日本語 🙂</answer>", add_special_tokens=False)
    assert "\ufffd" in "".join(pieces(tok, ids))  # the fixture really splits characters into byte tokens
    text, spans = token_char_spans(tok, ids)
    assert text == tok.decode(ids)
    assert [text[a:b] for a, b in spans][3:6] == [" 日"] * 3  # three byte tokens -> one character (with space)
    assert spans[-1][1] == len(text)


def test_locate_span_rules():
    assert locate_span("pre<think>a</think><answer>1</answer>post", ["<think>"], "</answer>") == (3, 37, True)
    assert locate_span("<answer>1</answer>", ["<think>"], "</answer>") == (0, 18, True)  # no <think>: from start
    assert locate_span("<think>a</think> no end", ["<think>"], "</answer>") == (0, 23, False)  # whole completion
    # the last </answer> closes the span; a <think> after it does not open one
    assert locate_span("<answer>1</answer><answer>2</answer><think>", ["<think>"], "</answer>") == (0, 36, True)
    # confidence rows: <analysis> first if present, else <confidence>
    starts = ["<analysis>", "<confidence>"]
    assert locate_span("x<confidence>0.5</confidence>", starts, "</confidence>") == (1, 29, True)
    assert locate_span("x<analysis>a</analysis><confidence>1</confidence>", starts, "</confidence>")[0] == 1


def test_answer_mask_with_merged_tag_tokens(tok):
    # tokens: 'Let',' me',' see','.<','think','>','2','+','2',' is',' ','4','</','think','>','\n','<','answer','>',
    #         '4','</','answer','>', then ' ok' (after the span) and <|im_end|>
    ids = tok.encode("Let me see.<think>2+2 is 4</think>\n<answer>4</answer> ok", add_special_tokens=False)
    ids = ids + [tok.eos_token_id]
    assert pieces(tok, ids)[3] == ".<"  # '.' and '<' merged: the token straddles the span start
    mask, closed = span_token_mask(tok, ids, ["<think>"], "</answer>", [tok.eos_token_id], train_on_eos=True)
    assert closed
    n = len(ids)
    expected = [0, 0, 0] + [1] * (n - 3 - 2) + [0, 1]  # '.<' in; ' ok' out; EOS in
    assert mask == expected
    mask_no_eos, _ = span_token_mask(tok, ids, ["<think>"], "</answer>", [tok.eos_token_id], train_on_eos=False)
    assert mask_no_eos == expected[:-1] + [0]


def test_confidence_mask_with_merged_boundary(tok):
    ids = tok.encode("Sure. <analysis>sure</analysis><confidence>0.9</confidence>", add_special_tokens=False)
    ids = ids + [tok.eos_token_id]
    p = pieces(tok, ids)
    assert "><" in p  # '</analysis' and '<confidence' share a token
    mask, closed = span_token_mask(tok, ids, ["<analysis>", "<confidence>"], "</confidence>", [tok.eos_token_id])
    first = p.index(" <") if " <" in p else p.index("<")
    assert closed and mask == [0] * first + [1] * (len(ids) - first)


def test_format_failure_trains_the_whole_completion(tok):
    ids = tok.encode("I think it is 4", add_special_tokens=False)  # no </answer>, truncated (no EOS)
    mask, closed = span_token_mask(tok, ids, ["<think>"], "</answer>", [tok.eos_token_id])
    assert not closed and mask == [1] * len(ids)


def test_empty_completion(tok):
    assert span_token_mask(tok, [], ["<think>"], "</answer>", [tok.eos_token_id]) == ([], False)
    assert span_token_mask(tok, [tok.eos_token_id], ["<think>"], "</answer>", [tok.eos_token_id]) == ([1], False)


def test_streaming_decoder_and_window_decoder_agree(tok):
    """`DecodeStream` (fast tokenizers) and the window decoder (others) give the same text and spans, split
    multi-byte characters, special tokens and leading spaces included."""
    import random

    from trl_ext.core.spans import _stream_spans, _window_spans

    rng = random.Random(0)
    samples = [tok("héllo 日本語 😀 <answer>4</answer>", add_special_tokens=False)["input_ids"]]
    samples += [[rng.randrange(len(tok)) for _ in range(rng.randrange(1, 12))] for _ in range(100)]
    for ids in samples:
        assert _stream_spans(tok.backend_tokenizer, ids) == _window_spans(tok, ids), ids
    text, spans = _stream_spans(tok.backend_tokenizer, tok("😀", add_special_tokens=False)["input_ids"])
    assert text == "😀" and len(set(spans)) == 1  # the emoji's byte tokens share one span
