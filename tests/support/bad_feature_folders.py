"""Shared by several test modules; moved from tests/test_bad_feature_folders.py."""
import io

import numpy as np

N, D = 12, 4


def _good(seed=0) -> dict:
    rng = np.random.default_rng(seed)
    return dict(query_features=rng.normal(size=(N, D)).astype(np.float32), query_labels=rng.integers(0, 3, N),
                gallery_features=rng.normal(size=(N, D)).astype(np.float32), gallery_labels=rng.integers(0, 3, N))


def _raw_members(**replace: bytes) -> dict[str, bytes]:
    """The good arrays as .npy bytes, some replaced by hand-made members."""
    out = {}
    for k, v in _good().items():
        buf = io.BytesIO()
        np.save(buf, v)
        out[f"{k}.npy"] = buf.getvalue()
    return out | {f"{k}.npy": v for k, v in replace.items()}


def steps(*overrides: dict, names=None):
    """A builder writing step_1..T.npz with the good arrays updated by each step's override (None value = key dropped)."""
    def build(folder):
        for t, over in enumerate(overrides, start=1):
            arrays = {k: v for k, v in (_good(t) | over).items() if v is not None}
            np.savez(folder / (names[t - 1] if names else f"step_{t}.npz"), **arrays)
    return build


def raw(name: str, make):
    def build(folder):
        steps({})(folder)
        make(folder / name)
    return build

