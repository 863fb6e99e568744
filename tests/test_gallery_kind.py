"""``protocol`` means closed/open set only; what a gallery item is (instance / template) is the gallery kind.

Rows stored before the rename keep ``protocol`` for the gallery kind in a comparison spec, a features config and a
study summary entry; they are read as before. The matrices' SQL column keeps its name, so no migration runs."""
from __future__ import annotations

import pytest

from engine.checkpoints.request import comparison_spec
from engine.core import vocab
from engine.results.study_summary import gallery_kind, header
from storage.models import GALLERY_KINDS, CompatibilityMatrix


def test_one_vocabulary_each():
    assert vocab.RUN_PROTOCOLS == ("closed-set", "open-set") and vocab.GALLERY_KINDS == ("instance", "template")
    assert GALLERY_KINDS == vocab.GALLERY_KINDS
    assert CompatibilityMatrix.__table__.c.keys().count("protocol") == 1  # the stored column, read as gallery_kind
    assert CompatibilityMatrix.gallery_kind.property.columns[0].name == "protocol"


def test_a_comparison_spec_writes_the_new_key_and_reads_the_old_one():
    models = [{"path": "a.pt"}, {"path": "b.pt"}]
    old = comparison_spec({"models": models, "dataset": "digits", "protocol": "template"})
    new = comparison_spec({"models": models, "dataset": "digits", "gallery_kind": "template"})
    assert old == new and new.gallery_kind == "template"
    stored = new.to_dict()
    assert stored["gallery_kind"] == "template" and "protocol" not in stored
    assert comparison_spec(stored) == new
    assert comparison_spec({"models": models, "dataset": "digits"}).gallery_kind == "instance"
    with pytest.raises(ValueError, match="gallery_kind must be 'instance' or 'template', got 'closed-set'"):
        comparison_spec({"models": models, "dataset": "digits", "gallery_kind": "closed-set"})


def test_a_study_summary_entry_under_either_key():
    assert gallery_kind({"gallery_kind": "template"}) == gallery_kind({"protocol": "template"}) == "template"
    assert gallery_kind({}) == ""
    summary = {"seeds": [0], "methods": {"bct": {"init_seed": "same", "views": {"encoder": {
        "recall@1": {"protocol": "template", "eval_classes": "all"}}}}}}
    assert header(summary, "recall@1").startswith("recall@1 | gallery template | eval_classes all | seeds 0")
