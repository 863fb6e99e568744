"""Evaluation protocols: closed-set, open-set on held-out shapes, and eval_classes = all | seen."""
import pytest
import torch

from engine.data.protocols import EVAL_CLASSES, PROTOCOLS, make_eval_split, restrict_eval_split
from engine.data.shapes import make_shapes


def test_closed_set_uses_the_test_split_as_query_and_gallery():
    split = make_eval_split("closed-set", dataset="digits")
    assert split.same_set and split.protocol == "closed-set" and split.query is split.gallery
    assert len(split.query) == 539  # round(0.3 x n_c) per class: 53+55+53+55+54+55+54+54+52+54


def test_open_set_shapes_uses_held_out_classes_after_the_trained_ones():
    options = {"num_classes": 20}
    split = make_eval_split("open-set", dataset="shapes", options=options, open_set_classes=4,
                            split_options={"train": {"per_class": 3}, "test": {"per_class": 2}})
    assert not split.same_set
    assert [name[:3] for name in split.query.class_names] == ["020", "021", "022", "023"]
    assert len(split.query) == 12 and len(split.gallery) == 8 and split.query.labels.tolist()[:4] == [0, 0, 0, 1]
    assert torch.equal(split.query.images, make_shapes(num_classes=4, per_class=3, first_class=20).images)
    assert torch.equal(split.gallery.images, make_shapes(num_classes=4, per_class=2, first_class=20, split="test").images)


def test_protocol_errors_are_explained():
    assert PROTOCOLS == ("closed-set", "open-set") and EVAL_CLASSES == ("all", "seen")
    with pytest.raises(ValueError, match="unknown protocol 'open'"):
        make_eval_split("open", dataset="digits")
    with pytest.raises(ValueError, match="open-set evaluation of 'digits' needs an open_set_dataset"):
        make_eval_split("open-set", dataset="digits")
    with pytest.raises(ValueError, match="would reuse the training classes"):
        make_eval_split("open-set", dataset="digits", open_set_dataset="digits")


def test_eval_classes_all_or_seen():
    split = make_eval_split("closed-set", dataset="shapes", options={"num_classes": 5, "per_class": 2})
    assert restrict_eval_split(split, eval_classes="all", seen_classes=[1]) is split
    seen = restrict_eval_split(split, eval_classes="seen", seen_classes=[3, 1])
    assert seen.same_set and seen.query is seen.gallery and seen.query.labels.tolist() == [1, 1, 3, 3]
    with pytest.raises(ValueError, match="eval_classes must be one of all, seen"):
        restrict_eval_split(split, eval_classes="old", seen_classes=[1])
    open_split = make_eval_split("open-set", dataset="shapes", options={"num_classes": 5, "per_class": 1})
    with pytest.raises(ValueError, match="needs the closed-set protocol"):
        restrict_eval_split(open_split, eval_classes="seen", seen_classes=[1])
