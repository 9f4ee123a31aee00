"""Naming the model a run started from: a Hub id for local checkpoints (the embedded default, a PEFT adapter, an earlier
run with a model card), so model cards name the real base model."""

from __future__ import annotations

import json
from pathlib import Path

from .default_model import embedded_model_name


def resolve_base_model(name_or_path: str | None) -> tuple[str | None, str | None]:
    """`(hub_id, local_dir)` of the model a run started from.

    A Hub id is returned as is. For a local directory: the embedded default's conversion gives its Hub name; a PEFT
    adapter gives its `base_model_name_or_path` (resolved in turn); a checkpoint with a model card (e.g. the output of
    an earlier run) gives the card's `base_model`. Otherwise the Hub id is `None` and only the directory is known.
    """
    if not name_or_path:
        return None, None
    path = Path(name_or_path)
    if not path.is_dir():
        return str(name_or_path), None
    if (name := embedded_model_name(path)) is not None:
        return name, str(path)
    adapter_config = path / "adapter_config.json"
    if adapter_config.is_file():
        try:
            base = json.loads(adapter_config.read_text()).get("base_model_name_or_path")
        except (OSError, ValueError):
            base = None
        if base and Path(base).resolve() != path.resolve():
            return resolve_base_model(base)[0], str(path)
    card = path / "README.md"
    if card.is_file():
        from huggingface_hub import ModelCard

        try:
            base = ModelCard.load(card, ignore_metadata_errors=True).data.base_model
        except Exception:  # an unreadable card only means the base stays unknown
            base = None
        if isinstance(base, list):
            base = base[0] if base else None
        if isinstance(base, str) and base and not Path(base).is_dir():
            return base, str(path)
    return None, str(path)
