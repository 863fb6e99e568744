"""Shared by several test modules; moved from tests/test_upgrade_plan_cli.py."""
from __future__ import annotations

import numpy as np

from engine.metrics.compatibility import CellFeatures
from support.upgrade import DIM, compatible_pair


def rotated_back_pair() -> tuple[CellFeatures, CellFeatures]:
    """New embeds the gallery as old does, rotated (new = old @ R), and its queries better (old's noise halved):
    better on its own, useless on the old gallery, and R^T (Procrustes on the gallery pairs) maps it back exactly."""
    old, better = compatible_pair()
    rotation, _ = np.linalg.qr(np.random.default_rng(7).normal(size=(DIM, DIM)))
    return old, CellFeatures(better.query @ rotation, better.query_labels, old.gallery @ rotation, old.gallery_labels)


def same_decision(md: str, plan: dict) -> None:
    """OUT.md is the release report in Markdown (engine.upgrade.release_report): the plan's decision first, then the
    inputs, the command line and the rest."""
    lines = [x for x in md.splitlines() if x]
    assert lines[0] == f"# Upgrade report: {plan['old_name']} -> {plan['new_name']}"
    assert lines[1] == f"**Decision: {plan['headline']}.** {plan['reason']}"
    assert "check-upgrade" in md  # the command line

