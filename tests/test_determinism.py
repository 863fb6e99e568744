"""The same config and seed store the same features and matrices, bit for bit, whatever the process's thread count.

Without the pinned arithmetic (``compute_threads``, engine.models.arithmetic) a 2-epoch digits run with 1 and with 2
threads stored features that differed by up to 1e-6 and mAP matrices by up to 1e-5 (measured on this project's 2-core
machine, torch 2.14): oneDNN's convolution weight gradients split their sum over the batch by thread.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from engine.core import threads
from engine.core.config import config_from_dict, dump_toml
from engine.models.arithmetic import arithmetic_record, pinned_arithmetic
from storage import get_engine, list_model_versions, load_feature_set, load_matrices, session_scope
from storage.models import Experiment

ROOT = Path(__file__).resolve().parents[1]
# the smallest run that trains a convolutional network over two steps and stores features and matrices
TINY = dict(name="determinism", methods=["independent"], seed=3, dataset=dict(name="digits"),
            scenario=dict(initial_classes=5, increment=5, num_steps=2), model=dict(backbone="small_cnn", width=8),
            training=dict(epochs=2, batch_size=64, lr=0.05), eval=dict(metrics=["recall@1", "map"]))


def _run(tmp_path: Path, count: int) -> str:
    """Run TINY through the CLI in a process whose torch, BLAS, OpenMP and numba have ``count`` threads; its db URL."""
    config = tmp_path / "tiny.toml"
    config.write_text(dump_toml(config_from_dict(TINY)))
    url = f"sqlite:///{tmp_path / f'threads{count}.sqlite'}"
    env = {k: v for k, v in os.environ.items() if k not in {threads.THREADS_ENV, *threads.LIBRARY_ENVS}}
    probe = "import torch; print(torch.get_num_threads())"
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=ROOT, check=True,
                          env={**env, **threads.thread_env(count)})
    assert proc.stdout.strip() == str(min(count, threads.available_cores())), "the child's torch threads"
    proc = subprocess.run([sys.executable, "-m", "engine", "run", str(config), "--quiet", "--db", url,
                           "--checkpoints", str(tmp_path / f"ckpt{count}")], capture_output=True, text=True, cwd=ROOT,
                          env={**env, **threads.thread_env(count), "PYTHONPATH": str(ROOT)}, timeout=900)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return url


def _stored(url: str) -> tuple[dict, dict]:
    """({(view, metric): (matrix, summary)}, {(step, split, view): (features, labels)}) of the run's one experiment."""
    matrices, features = {}, {}
    with session_scope(get_engine(url)) as s:
        (exp,) = s.query(Experiment).all()
        for m in load_matrices(s, exp.id):
            matrices[(m.view, m.metric)] = (np.array(m.values, dtype=np.float64), m.summary)
        for v in list_model_versions(s, exp.id):
            for split in ("query", "gallery", "train"):
                for view in ("encoder", "logits", "softmax"):
                    feats, labels, _ = load_feature_set(s, v.id, split, view)
                    features[(v.step, split, view)] = (np.asarray(feats), np.asarray(labels))
    return matrices, features


@pytest.mark.slow
@pytest.mark.skipif(threads.available_cores() < 2, reason="needs 2 cores for a 2-thread process")
def test_one_and_two_threads_store_identical_features_and_matrices(tmp_path):
    one, two = _stored(_run(tmp_path, 1)), _stored(_run(tmp_path, 2))
    (m1, f1), (m2, f2) = one, two
    assert set(m1) == set(m2) == {("encoder", "recall@1"), ("encoder", "map")}
    assert set(f1) == set(f2) and len(f1) == 2 * 3 * 3
    for key, (values, summary) in m1.items():
        assert np.array_equal(values, m2[key][0], equal_nan=True), key
        assert summary == m2[key][1], key  # AC/AA, paired intervals and the recorded arithmetic
        assert summary["arithmetic"]["compute_threads"] == 1
        assert summary["arithmetic"]["torch"] == torch.__version__ and summary["arithmetic"]["deterministic_algorithms"]
    for key, (feats, labels) in f1.items():
        assert feats.dtype == f2[key][0].dtype and np.array_equal(feats, f2[key][0]), key  # bit for bit
        assert np.array_equal(labels, f2[key][1]), key


def test_the_pinned_arithmetic_restores_the_process_settings():
    before, deterministic = torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()
    with pinned_arithmetic(3):
        assert torch.get_num_threads() == 3 and torch.are_deterministic_algorithms_enabled()
    assert torch.get_num_threads() == before and torch.are_deterministic_algorithms_enabled() == deterministic


def test_the_record_names_threads_versions_and_instruction_set():
    record = arithmetic_record(2)
    assert record["compute_threads"] == 2 and record["numpy"] == np.__version__
    assert record["cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    assert "data_parallel_ranks" not in record and arithmetic_record(1, nproc=2)["data_parallel_ranks"] == 2


def test_compute_threads_defaults_to_one_and_is_stored_with_the_config():
    cfg = config_from_dict({})
    assert cfg.compute_threads == 1 and cfg.to_dict()["compute_threads"] == 1
    assert config_from_dict({"compute_threads": 4}).to_dict()["compute_threads"] == 4


@pytest.mark.parametrize(("value", "message"), [
    (0, r"config key compute_threads must be a finite number in \[1, 1024\], got 0"),
    (2000, r"config key compute_threads must be a finite number in \[1, 1024\], got 2000"),
    (1.5, r"config key compute_threads must be int, got 1.5"),
    ("two", r"config key compute_threads must be int, got 'two'"),
])
def test_a_bad_compute_thread_count_is_refused_in_one_line(value, message):
    with pytest.raises(ValueError, match=message):
        config_from_dict({"compute_threads": value})
