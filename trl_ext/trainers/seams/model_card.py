"""Model cards for the trl-ext trainers: TRL's card, with the real base model, the data and the run's results.

TRL's `create_model_card` (called at every checkpoint, by `push_to_hub`, and by the recipes at the end of a run)
renders its template with the trainer's `_tag_names`, `_name` and `_paper`. It knows the base model only when the
model was loaded by Hub id: a local base (the embedded default, a previous run) shows as "None". `ModelCardMixin`
runs TRL's method with the resolved base model in place of the local path, then adds what TRL's template has no place
for: the training data when it is not a Hub dataset, the run's headline results, and PEFT's metadata for adapters
(PEFT's own card, written by `save_pretrained`, would replace TRL's tags and name a local path as base model).
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ...models.naming import resolve_base_model
from .scoping import scoped_call


NOT_MEASURED = "n/a"


def results_table(results: Mapping[str, Any]) -> str:
    """A two-column markdown table; floats with 3 decimals; a value that was not measured or is undefined (`None`,
    NaN: AUROC without both outcomes, a metric without a parsed confidence) as n/a, the one way the card says it."""
    rows = ["| metric | value |", "| --- | --- |"]
    for name, value in results.items():
        if value is None or (isinstance(value, float) and not math.isfinite(value)):
            shown = NOT_MEASURED
        else:
            shown = f"{value:.3f}" if isinstance(value, float) else str(value)
        rows.append(f"| {name} | {shown} |")
    rows.append("")
    rows.append(f"{NOT_MEASURED}: not measured, or undefined for this run (e.g. AUROC when every answer was right).")
    return "\n".join(rows)


def confidence_usage(model_id: str, args, system_prompt: str | None) -> str:
    """The card section that shows how to ask an RLCR model for its confidence: the answer turn, then the confidence
    prompt it was trained with as the next user turn, with its generation lengths."""
    system = f'    {{"role": "system", "content": {system_prompt!r}}},\n' if system_prompt else ""
    return f"""## Asking for the confidence

The model answers, then states how sure it is when asked with the confidence prompt it was trained with:

```python
import re

from transformers import pipeline

generator = pipeline("text-generation", model="{model_id}")
messages = [
{system}    {{"role": "user", "content": "What is 17 * 23?"}},
]
answer = generator(messages, max_new_tokens={args.max_completion_length}, return_full_text=False)[0]["generated_text"]
messages += [
    {{"role": "assistant", "content": answer}},
    {{"role": "user", "content": {args.confidence_prompt!r}}},
]
reply = generator(messages, max_new_tokens={args.max_confidence_length}, return_full_text=False)[0]["generated_text"]
confidence = re.search(r"<{args.confidence_tag}>(.*?)</{args.confidence_tag}>", reply, re.DOTALL)
print(answer, "| confidence:", confidence.group(1).strip() if confidence else "not stated")
```
"""


def arxiv_paper(key: str, title: str, authors: str, year: int, arxiv_id: str) -> dict[str, str]:
    """A trainer's `_paper` (the paper TRL's model card cites) for an arXiv preprint, its BibTeX as TRL writes it."""
    citation = "\n".join(
        [
            f"@article{{{key},",
            f"    title        = {{{{{title}}}}},",
            f"    author       = {{{authors}}},",
            f"    year         = {year},",
            f"    journal      = {{arXiv preprint arXiv:{arxiv_id}}}",
            "}",
        ]
    )
    return {"title": title, "id": arxiv_id, "citation": citation}


class ModelCardMixin:
    """Mixin for a `GRPOTrainer` subclass (listed before it; the trainers get it from their base):
    `create_model_card` as TRL's, completed.

    `set_model_card_details(...)` records what only the caller knows (the data, the headline results); every later
    card (checkpoints, the end of a recipe, `push_to_hub`) includes it, so the pushed card is the one on disk.
    """

    _card_details: dict = {}

    def set_model_card_details(
        self,
        dataset_name: str | None = None,
        dataset_description: str | None = None,
        results: Mapping[str, Any] | None = None,
    ) -> None:
        """Record the card's data and results.

        Args:
            dataset_name: A Hub dataset id (linked and put in the card's metadata by TRL's template).
            dataset_description: The training data in words, for data that is not on the Hub (a local file, a
                built-in generator).
            results: Headline metrics of the run, e.g. `{"ECE before": 0.31, "ECE after": 0.12}`.
        """
        self._card_details = {
            "dataset_name": dataset_name,
            "dataset_description": dataset_description,
            "results": dict(results or {}),
        }

    def create_model_card(
        self, model_name: str | None = None, dataset_name: str | None = None, tags: str | list[str] | None = None
    ):
        if not self.is_world_process_zero():
            return
        details = self._card_details
        dataset_name = dataset_name or details.get("dataset_name")
        output_dir = Path(self.args.output_dir)
        config = self.model.config  # a PEFT model forwards to its base model's config
        base, local = resolve_base_model(getattr(config, "_name_or_path", None))
        # TRL reads the base model from the config and the quick-start model id from `hub_model_id`: give it the
        # resolved Hub id, and the output directory for a card that stays local.
        with (
            scoped_call(config, _name_or_path=base or ""),
            scoped_call(self, hub_model_id=self.hub_model_id or str(output_dir)),
        ):
            super().create_model_card(model_name=model_name or output_dir.name, dataset_name=dataset_name, tags=tags)
        self._complete_card(output_dir / "README.md", base, local, details)

    def _complete_card(self, path: Path, base: str | None, local: str | None, details: dict) -> None:
        from huggingface_hub import ModelCard

        card = ModelCard.load(path)
        text = card.text
        if base is None:
            where = f"the local checkpoint `{local}`" if local else "a model whose name was not recorded"
            text = text.replace("[None](https://huggingface.co/None)", where)
        elif (start := _start_note(local, base)) is not None:
            text = text.replace("It has been trained using", f"{start}\nIt has been trained using", 1)

        section = []
        if details.get("dataset_description"):
            section.append(f"Training data: {details['dataset_description']}.")
        if details.get("results"):
            section.append(results_table(details["results"]))
        body = ""
        if hasattr(self.args, "confidence_prompt"):  # RLCR: the point of the model is its stated confidence
            body += confidence_usage(self.hub_model_id or str(path.parent), self.args, self._card_system_prompt())
            body += "\n"
        if section:
            body += "## Results\n\n" + "\n\n".join(section) + "\n\n"
        if body:
            anchor = "## Training procedure"
            text = text.replace(anchor, body + anchor, 1) if anchor in text else text + "\n" + body

        from accelerate.utils import is_peft_model

        if is_peft_model(self.model):
            import peft

            card.data.library_name = "peft"
            extra = ["peft", *(["lora"] if _is_lora(self.model) else [])]
            extra += [f"base_model:adapter:{base}"] if base else []
            card.data.tags = [*card.data.tags, *(t for t in extra if t not in card.data.tags)]
            versions = "### Framework versions\n\n"
            text = text.replace(versions, f"{versions}- PEFT: {peft.__version__}\n", 1)
        card.text = text
        card.save(os.fspath(path))

    def _card_system_prompt(self) -> str | None:
        """The system message of the training prompts (the recipes put the answer format there), if they have one."""
        dataset = getattr(self, "train_dataset", None)
        try:
            prompt = dataset[0]["prompt"]
        except (TypeError, KeyError, IndexError):
            return None
        if isinstance(prompt, list) and prompt and prompt[0].get("role") == "system":
            return prompt[0].get("content")
        return None


def _start_note(local: str | None, base: str) -> str | None:
    """What the card says about a local starting point whose Hub name is known: nothing for the embedded default (its
    cache directory means nothing to a reader), the warm-up for a format warm-up checkpoint, else the directory."""
    from ...models.default_model import embedded_model_name

    if local is None or embedded_model_name(Path(local)) is not None:
        return None
    card = Path(local) / "README.md"
    if card.is_file() and "trl-ext-format-warmup" in card.read_text(errors="replace"):
        return (
            f"It started from a short supervised warm-up of {base} on the output format "
            "(`trl_ext.models.warmup.format_warmup`, the recipe's `--warmup_samples`)."
        )
    return f"It started from the local checkpoint `{local}`."


def _is_lora(model) -> bool:
    peft_type = getattr(getattr(model, "active_peft_config", None), "peft_type", None)
    return str(getattr(peft_type, "value", peft_type)).upper() == "LORA"
