"""Adapters give numbers or a refusal (issue 39, "numbers"; "allocation bombs" and "hangs" of the options): weights
that overflow or underflow float32, options past their ceilings, a diverging fit, resamples past theirs; each one line."""
from __future__ import annotations

import json

import numpy as np
import pytest
from safetensors.numpy import save_file
from support.adapters_export import small_map

from engine.adapters.artifact import AdapterFileError, load_adapter, save_adapter
from engine.adapters.posthoc import fit_map, options_for
from engine.core.vocab import MAX_RESAMPLES, check_resamples


def tampered(folder, scale: float) -> None:
    """The saved affine map's weights multiplied by ``scale`` (float32 on disk, as the format stores them)."""
    from safetensors.numpy import load_file

    t = load_file(str(folder / "adapter.safetensors"))
    t["weight"] = (t["weight"].astype(np.float64) * scale).astype(np.float32)
    save_file(t, str(folder / "adapter.safetensors"), metadata={"format": "pt"})
    info = json.loads((folder / "adapter.json").read_text())
    (folder / "adapter.json").write_text(json.dumps(info))


@pytest.mark.parametrize("scale, message", [(3e38 / 4, "above 1e\\+06"), (1e-30, "all below 1e-06")])
def test_weights_that_overflow_or_underflow_float32_are_refused_on_load(tmp_path, scale, message):
    save_adapter(small_map(), tmp_path / "ad", onnx=False)
    tampered(tmp_path / "ad", scale)
    with pytest.raises(AdapterFileError, match=message):
        load_adapter(tmp_path / "ad")


@pytest.mark.parametrize("kind, options, message", [
    ("mlp", {"rank": 100_000_000}, "rank must be from 1 to 8,192"),
    ("mlp", {"epochs": 1_000_000_000}, "epochs must be from 1 to 10,000"),
    ("mlp", {"lr": 1e30}, r"lr must be a number in \(0, 10\]"),
    ("cluster", {"temperature": 1e-45}, "temperature must be a number from 0.0001 to 100"),
    ("cluster", {"clusters": 10**9}, "clusters must be from 1 to 4096")])
def test_options_past_their_ceilings_are_refused_before_any_work(kind, options, message):
    with pytest.raises(ValueError, match=message):
        options_for(kind, options)


def test_a_fit_that_diverges_is_refused(monkeypatch):
    """A fit whose weights come back non-finite (a diverged optimiser) is refused in one line, not returned."""
    import dataclasses

    from engine.adapters import posthoc

    entry = posthoc.POSTHOC["affine"]
    diverged = lambda new, old, opts: {k: v * np.inf for k, v in entry.fit(new, old, opts).items()}  # noqa: E731
    monkeypatch.setitem(posthoc.POSTHOC, "affine", dataclasses.replace(entry, fit=diverged))
    rng = np.random.default_rng(0)
    with pytest.raises(ValueError, match="the fitted affine adapter: weights weight hold .* NaN or infinite") as exc:
        fit_map("affine", rng.standard_normal((50, 6)), rng.standard_normal((50, 4)))
    assert "\n" not in str(exc.value)


def test_resamples_have_a_ceiling():
    assert check_resamples(MAX_RESAMPLES) == MAX_RESAMPLES
    for bad in (0, MAX_RESAMPLES + 1, 1_000_000_000, True, 2.0):
        with pytest.raises(ValueError, match="resamples must be an integer from 1 to 100,000"):
            check_resamples(bad)


def test_rows_far_beyond_float32_squares_keep_their_unit_length():
    """A row of 1e20s (x^2 overflows float32) normalises to unit length, as numpy in float64 says, not to zeros."""
    from engine.adapters.posthoc import l2_rows

    x = np.array([[1e20, 1e20, 0.0], [3.0, 4.0, 0.0]], np.float32)
    got = l2_rows(x)
    want = x.astype(np.float64) / np.linalg.norm(x.astype(np.float64), axis=1, keepdims=True)
    np.testing.assert_allclose(got, want, rtol=1e-6)  # float32 output of a float64 division: rounding only
    assert np.allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-6)
