"""The paper's query/gallery combination table, with an injected nearest-neighbour evaluator."""
import math

import numpy as np
import pytest
import torch
from scipy.linalg import expm

from engine.adapters.modules import AffineAdapter, OrthogonalAdapter
from engine.adapters.pair import AdapterPair
from engine.adapters.table import COMBINATION_ROWS, EXTRA_ROWS, combination_table

rng = np.random.default_rng(0)
LABELS = np.repeat(np.arange(5), 6)
OLD = (rng.normal(size=(5, 4))[LABELS] * 2 + rng.normal(size=(30, 4))).astype(np.float32)
NEW = (rng.normal(size=(5, 6))[LABELS] * 2 + rng.normal(size=(30, 6))).astype(np.float32)
calls = []


def nn_evaluate(query, query_labels, gallery, gallery_labels):
    """Leave-one-out 1-NN accuracy and the mean distance to it (query i is gallery i), recorded per call."""
    dist = np.sqrt(((query[:, None, :].astype(np.float64) - gallery[None, :, :]) ** 2).sum(-1))
    np.fill_diagonal(dist, np.inf)
    nearest = dist.argmin(axis=1)
    calls.append((query.shape, gallery.shape))
    return {
        "recall@1": float((gallery_labels[nearest] == query_labels).mean()),
        "nn_distance": float(dist.min(axis=1).mean()),
    }


def make_pair(with_forward=True, kind="perp"):
    """A 4-d old / 6-d new pair with fixed weights: B a rotation of the first 4 new components."""
    generator = torch.Generator().manual_seed(0)
    backward = OrthogonalAdapter(4) if kind == "perp" else None
    if backward is not None:
        with torch.no_grad():
            backward.A.copy_(torch.randn(4, 4, generator=generator))
    width = 4 if kind == "perp" else 6
    forward = AffineAdapter(4, width, generator=generator) if with_forward else None
    return AdapterPair(kind=kind, old_dim=4, new_dim=6, dim_mismatch="truncate", forward=forward, backward=backward)


def test_six_rows_carry_the_injected_evaluators_numbers():
    pair = make_pair()
    table = combination_table(OLD, NEW, OLD, NEW, LABELS, LABELS, pair, evaluate=nn_evaluate)
    assert [r["row"] for r in table] == list(COMBINATION_ROWS) == [
        "old/old", "new/old", "F(old)/F(old)", "B(new)/F(old)", "B(new)/old", "B(new)/B(new)",
    ]
    f_old = OLD @ pair.forward.weight.detach().numpy().T + pair.forward.bias.detach().numpy()
    upper = np.triu(pair.backward.A.detach().numpy().astype(np.float64), 1)
    w = expm(upper - upper.T)
    b_new = NEW[:, :4] @ w.T  # truncate the 6-d new features to the 4-d old width, then rotate
    expected = {
        "old/old": (OLD, OLD),
        "new/old": (NEW[:, :4], OLD),
        "F(old)/F(old)": (f_old, f_old),
        "B(new)/F(old)": (b_new, f_old),
        "B(new)/old": (b_new, OLD),
        "B(new)/B(new)": (b_new, b_new),
    }
    for row in table:
        query, gallery = expected[row["row"]]
        want = nn_evaluate(query.astype(np.float32), LABELS, gallery.astype(np.float32), LABELS)
        assert row["recall@1"] == want["recall@1"]
        assert row["nn_distance"] == pytest.approx(want["nn_distance"], rel=1e-5)
        assert row["query"] + "/" + row["gallery"] == row["row"]
    # the rotation is an isometry: B(new)/B(new) equals the truncated new/new self-test
    assert table[-1]["recall@1"] == nn_evaluate(NEW[:, :4], LABELS, NEW[:, :4], LABELS)["recall@1"]


def test_extra_rows_and_missing_forward_give_nan():
    pair = make_pair(with_forward=False)
    table = combination_table(
        OLD, NEW, OLD, NEW, LABELS, LABELS, pair, evaluate=nn_evaluate, rows=COMBINATION_ROWS + EXTRA_ROWS
    )
    by_row = {r["row"]: r for r in table}
    assert len(table) == 8 and set(EXTRA_ROWS) <= set(by_row)
    for row in ("F(old)/F(old)", "B(new)/F(old)", "F(old)/old"):
        assert math.isnan(by_row[row]["recall@1"]) and math.isnan(by_row[row]["nn_distance"])
    assert by_row["new/new"]["recall@1"] == nn_evaluate(NEW, LABELS, NEW, LABELS)["recall@1"]


def test_fct_pair_reads_b_as_the_identity():
    pair = make_pair(kind="fct")
    table = {r["row"]: r for r in combination_table(OLD, NEW, OLD, NEW, LABELS, LABELS, pair, evaluate=nn_evaluate)}
    assert table["B(new)/B(new)"]["recall@1"] == nn_evaluate(NEW, LABELS, NEW, LABELS)["recall@1"]
    assert table["B(new)/old"]["recall@1"] == table["new/old"]["recall@1"]


def test_each_view_is_evaluated_once_per_row_and_inputs_are_checked():
    calls.clear()
    combination_table(OLD, NEW, OLD, NEW, LABELS, LABELS, make_pair(), evaluate=nn_evaluate)
    assert len(calls) == 6
    with pytest.raises(ValueError, match="unknown rows"):
        combination_table(OLD, NEW, OLD, NEW, LABELS, LABELS, make_pair(), evaluate=nn_evaluate, rows=("B(old)/old",))
    with pytest.raises(ValueError, match="query new features have 5 dimensions but the adapters were trained on 6-d"):
        combination_table(OLD, NEW[:, :5], OLD, NEW, LABELS, LABELS, make_pair(), evaluate=nn_evaluate)
    with pytest.raises(ValueError, match="gallery old features has 29 rows but gallery new features has 30"):
        combination_table(OLD, NEW, OLD[:29], NEW, LABELS, LABELS, make_pair(), evaluate=nn_evaluate)
    with pytest.raises(ValueError, match="gallery labels has 29 entries"):
        combination_table(OLD, NEW, OLD, NEW, LABELS, LABELS[:29], make_pair(), evaluate=nn_evaluate)
