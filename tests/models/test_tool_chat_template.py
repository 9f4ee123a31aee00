"""use_tool_chat_template: TRL's Qwen2.5 template on SmolLM2's tokenizer (the embedded default and the tiny models)."""

import pytest
from transformers import AutoTokenizer
from trl.chat_template_utils import is_chat_template_prefix_preserving, supports_tool_calling

from trl_ext import use_tool_chat_template
from trl_ext.models.default_model import default_model_path
from trl_ext.testing import tiny_tokenizer, tool_call_text


def increment(amount: int) -> str:
    """Add to the counter.

    Args:
        amount: How much to add.
    """
    return str(amount)


@pytest.mark.parametrize("load", [lambda: AutoTokenizer.from_pretrained(default_model_path()), tiny_tokenizer])
def test_smollm2_tokenizer_gets_a_tool_template_trl_can_parse(load):
    original = load()
    tokenizer = use_tool_chat_template(load())
    assert not supports_tool_calling(original)  # SmolLM2's own template renders no tools
    assert supports_tool_calling(tokenizer) and is_chat_template_prefix_preserving(tokenizer)

    # Plain conversations (with a system message) render exactly as with SmolLM2's template: same ChatML turns.
    chat = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    assert tokenizer.apply_chat_template(
        chat, tokenize=False, add_generation_prompt=True
    ) == original.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)

    # Tools are listed in the system turn; a tool call in that format parses back into TRL's message form.
    rendered = tokenizer.apply_chat_template(chat, tools=[increment], tokenize=False, add_generation_prompt=True)
    assert rendered.startswith("<|im_start|>system\nBe brief.\n\n# Tools") and '"name": "increment"' in rendered
    prompt = tokenizer.apply_chat_template(chat, tools=[increment], add_generation_prompt=True, return_dict=True)
    completion = tokenizer.encode(tool_call_text("increment", amount=2) + "<|im_end|>", add_special_tokens=False)
    assert tokenizer.parse_response(completion, prefix=prompt["input_ids"]) == {
        "role": "assistant",
        "tool_calls": [{"type": "function", "function": {"name": "increment", "arguments": {"amount": 2}}}],
    }
    plain = tokenizer.encode("Done.<|im_end|>", add_special_tokens=False)
    assert tokenizer.parse_response(plain, prefix=prompt["input_ids"]) == {"role": "assistant", "content": "Done."}


def test_non_chatml_tokenizer_is_refused():
    class Tokenizer:
        chat_template = "{{ messages }}"

        def get_vocab(self):
            return {"<s>": 0}

    with pytest.raises(ValueError, match=r"ChatML.*\['<\|im_start\|>', '<\|im_end\|>'\]"):
        use_tool_chat_template(Tokenizer())
