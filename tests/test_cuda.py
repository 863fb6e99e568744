"""The CUDA paths: training with autocast, extraction, the torch search backend on the GPU, faiss on the GPU, the
text encoders (torch BERT on CUDA; onnxruntime's CUDA provider where the installed onnxruntime has one).

Marked ``cuda`` and skipped without a GPU (CI has none); run them where one is present with
``python -m pytest -m cuda tests/test_cuda.py``. Every expectation is the CPU result of the same code,
so a GPU run checks that the device paths compute what the CPU paths compute.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from engine.core.config import TrainingConfig
from engine.data.shapes import make_shapes
from engine.models.extract import extract_outputs
from engine.methods import build_method
from engine.methods.base import StepContext
from engine.metrics.retrieval import cell_stats, retrieval_metrics
from engine.metrics.search import TorchBackend
from engine.models import build_model
from engine.methods.training import train_step

pytestmark = [pytest.mark.cuda,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU on this machine")]


def _tied_cell(seed: int, n: int = 600, dim: int = 8, classes: int = 12):
    """Small-integer features: every dot product is exact in float32 on any device, and ties are common."""
    rng = np.random.default_rng(seed)
    query = rng.integers(-2, 3, size=(n, dim)).astype(np.float32)
    gallery = rng.integers(-2, 3, size=(n, dim)).astype(np.float32)
    return query, rng.integers(0, classes, n), gallery, rng.integers(0, classes, n)


@pytest.mark.parametrize("same_set", [False, True])
@pytest.mark.parametrize("gallery_kind", ["instance", "template"])
def test_torch_backend_on_cuda_gives_the_cpu_statistics(gallery_kind, same_set):
    query, q_labels, gallery, g_labels = _tied_cell(1)
    if same_set:
        gallery, g_labels = query, q_labels
    kwargs = dict(gallery_kind=gallery_kind, same_set=same_set, map_k=10, want_ap=True)
    cpu = cell_stats(query, q_labels, gallery, g_labels, backend=TorchBackend("cpu"), **kwargs)
    gpu = cell_stats(query, q_labels, gallery, g_labels, backend=TorchBackend("cuda"), **kwargs)
    # unit-normalising integer rows rounds differently on the two devices, so compare ranks, not bits
    np.testing.assert_array_equal(gpu.n_positives, cpu.n_positives)
    assert np.mean(gpu.neg_ge_best == cpu.neg_ge_best) > 0.99
    np.testing.assert_allclose(np.nan_to_num(gpu.ap), np.nan_to_num(cpu.ap), atol=2e-2)


def test_retrieval_metrics_on_cuda_match_cpu_on_separated_features():
    rng = np.random.default_rng(3)
    centres = rng.normal(size=(10, 64)).astype(np.float32)
    labels = rng.integers(0, 10, 2000)
    feats = centres[labels] + 0.6 * rng.normal(size=(2000, 64)).astype(np.float32)
    cpu = retrieval_metrics(feats, labels, feats, labels, same_set=True, ks=(1, 5), backend=TorchBackend("cpu"))
    gpu = retrieval_metrics(feats, labels, feats, labels, same_set=True, ks=(1, 5), backend=TorchBackend("cuda"))
    for key in ("recall@1", "recall@5", "map"):
        assert gpu[key] == pytest.approx(cpu[key], abs=1e-3), key


def test_faiss_gpu_index_gives_the_torch_recall():
    faiss = pytest.importorskip("faiss")
    if faiss.get_num_gpus() == 0:
        pytest.skip("faiss has no GPU here (a CPU-only faiss build, or its CUDA libraries are missing)")
    query, q_labels, gallery, g_labels = _tied_cell(2)
    torch_r = retrieval_metrics(query, q_labels, gallery, g_labels, ks=(1,), compute_map=False, backend="torch")
    faiss_r = retrieval_metrics(query, q_labels, gallery, g_labels, ks=(1,), compute_map=False, backend="faiss")
    assert faiss_r["recall@1"] == torch_r["recall@1"]


def _train(device: str, amp: bool) -> tuple[torch.nn.Module, list[dict[str, float]]]:
    data = make_shapes(num_classes=6, per_class=40)
    net = build_model(backbone="small_cnn", head="linear", num_classes=6, width=16, seed=0)
    ctx = StepContext(step=1, seen_classes=tuple(range(6)), new_classes=tuple(range(6)), old_model=None)
    cfg = TrainingConfig(epochs=2, batch_size=32, lr=0.01, amp=amp)
    history = train_step(net, build_method("independent"), data.images, data.labels, ctx, cfg,
                         device=torch.device(device), seed=0, augment_images=True)
    return net.cpu(), history


def test_training_on_cuda_without_amp_follows_the_cpu_run():
    cpu_net, cpu_hist = _train("cpu", amp=False)
    gpu_net, gpu_hist = _train("cuda", amp=False)
    # same seed, same batches, same augmentation: only float rounding differs (cuDNN vs CPU kernels)
    for a, b in zip(cpu_hist, gpu_hist):
        assert b["ce"] == pytest.approx(a["ce"], rel=2e-2)
    for (name, p), q in zip(cpu_net.state_dict().items(), gpu_net.state_dict().values()):
        if p.is_floating_point():
            torch.testing.assert_close(q, p, rtol=5e-2, atol=5e-3, msg=name)


def test_training_on_cuda_with_amp_learns():
    _, hist = _train("cuda", amp=True)
    assert all(np.isfinite(h["ce"]) for h in hist)
    assert hist[-1]["ce"] < hist[0]["ce"]


def test_extraction_on_cuda_matches_cpu_within_half_precision():
    data = make_shapes(num_classes=4, per_class=20)
    net = build_model(backbone="small_cnn", head="linear", num_classes=4, width=16, seed=0)
    cpu = extract_outputs(net, data.images, device="cpu")
    gpu = extract_outputs(net, data.images, device="cuda")  # autocast float16 on CUDA
    assert next(net.parameters()).device.type == "cpu"  # the network goes back where it was
    for view in ("encoder", "logits", "softmax"):
        np.testing.assert_allclose(gpu[view], cpu[view], rtol=2e-2, atol=2e-2, err_msg=view)


def _digits_matrices(device: str, folder) -> dict[tuple[int, str, str], np.ndarray]:
    import dataclasses

    from sqlalchemy import select

    from engine.run.pipeline import RunContext, run_study
    from engine.core.presets import preset_config
    from storage import CompatibilityMatrix, Experiment, get_engine, init_db, session_scope

    cfg = dataclasses.replace(preset_config("digits-tiny"), device=device)
    db = get_engine(f"sqlite:///{folder / 'db.sqlite'}")
    init_db(db)
    _, ids = run_study(cfg, RunContext(db, folder / "ckpt"))
    with session_scope(db) as s:
        rows = s.execute(select(CompatibilityMatrix, Experiment.method).join(Experiment)
                         .where(CompatibilityMatrix.experiment_id.in_(ids))).all()
        return {(m.metric, m.view, method): np.asarray(m.values, dtype=float) for m, method in rows}


def test_a_digits_study_on_cuda_stores_what_the_cpu_run_stores(tmp_path):
    (tmp_path / "cpu").mkdir()
    (tmp_path / "gpu").mkdir()
    cpu = _digits_matrices("cpu", tmp_path / "cpu")
    gpu = _digits_matrices("cuda", tmp_path / "gpu")
    assert gpu.keys() == cpu.keys() and cpu
    for key, values in cpu.items():
        # same seeds and batches; AMP and cuDNN rounding move a 2-epoch model's retrieval by a few points at most
        np.testing.assert_allclose(gpu[key], values, atol=0.06, equal_nan=True, err_msg=str(key))


def _text_folder(tmp_path):
    """A tiny BERT sentence-encoder folder (tokenizer.json, config.json, model.safetensors, mean pooling)."""
    pytest.importorskip("tokenizers")
    from support.text_encoders import write_tiny_folder  # the same tiny model the CPU text tests use

    write_tiny_folder(tmp_path / "m")
    return tmp_path / "m"


def test_a_safetensors_text_encoder_on_cuda_gives_the_cpu_embeddings(tmp_path):
    from engine.data.text_model_files import ModelFolder
    from engine.models.text_encoder import load_text_folder

    folder = _text_folder(tmp_path)
    texts = ["the cat sat on the mat", "the dog", "mat", "the cat the dog the mat sat on"] * 40
    out = {}
    for device in ("cpu", "cuda"):
        encoder = load_text_folder(ModelFolder(folder), name="tiny", device=device)
        try:
            assert next(encoder.net.parameters()).device.type == device
            out[device] = encoder.encode(texts, batch_size=32)
        finally:
            encoder.close()
    np.testing.assert_allclose(out["cuda"], out["cpu"], atol=1e-5)  # float32 on both: no autocast in the text path


def test_an_onnx_text_encoder_uses_the_cuda_provider_when_onnxruntime_has_one(tmp_path):
    ort = pytest.importorskip("onnxruntime")
    if "CUDAExecutionProvider" not in ort.get_available_providers():
        pytest.skip(f"onnxruntime {ort.__version__} here has no CUDA provider ({ort.get_available_providers()})")
    from engine.models.text_models import load_text_model, missing_text_models

    if missing_text_models(("minilm_l3",)):
        pytest.skip("the minilm_l3 weight package is not installed")
    texts = ["A fanatic is one who can't change his mind and won't change the subject", "the cat sat"] * 20
    cpu = load_text_model("minilm_l3", device="cpu")
    gpu = load_text_model("minilm_l3", device="cuda")
    try:
        assert gpu.session.get_providers()[0] == "CUDAExecutionProvider"
        np.testing.assert_allclose(gpu.encode(texts, batch_size=8), cpu.encode(texts, batch_size=8), atol=1e-4)
    finally:
        cpu.close()
        gpu.close()
