"""Data-parallel training (engine.run.ddp): 2 CPU processes over gloo on the tiny digits config."""

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

import engine.run.pipeline as pipeline
from engine.cli import main
from engine.core.config import config_from_dict
from engine.methods import build_method
from engine.methods.base import StepContext
from engine.run.data_setup import prepare_run_data
from engine.run.ddp import GroupBatchNorm, available_processes, train_step_parallel
from engine.run.pipeline import RunContext, run_experiment
from engine.core.signals import Cancelled
from storage import get_engine, list_model_versions, load_feature_set, session_scope

TINY = {
    "dataset": {"name": "digits"},
    "scenario": {"initial_classes": 5, "increment": 5, "num_steps": 2},
    "model": {"backbone": "small_cnn", "width": 8},
    "training": {"epochs": 1, "batch_size": 64, "lr": 0.05},
    "methods": ["bct"],  # a loss on the old model: it must reach every rank
}
needs_two = pytest.mark.skipif(available_processes(torch.device("cpu")) < 2, reason="needs 2 CPU cores for 2 ranks")


def _cfg(batch_size: int, **over):
    return config_from_dict({**TINY, "training": {**TINY["training"], "batch_size": batch_size}, **over})


# fine-tuned from the old model with replay, distilled on every sample: a plain per-sample mean with the old model
# (BCT's influence term is a mean over each rank's old-class samples, whose count differs per rank: as in any DDP
# training that mean is averaged per rank, equal to one process's only in expectation)
DISTILL = {"methods": ["dsimplex_fd"], "method_params": {"dsimplex_fd": {"distill_on": "all"}},
           "scenario": {**TINY["scenario"], "training": "finetune", "replay_per_class": 10}}


@needs_two
def test_every_rank_ends_with_the_same_parameters(tmp_path):
    cfg = _cfg(32)
    data = prepare_run_data(cfg)
    method = build_method("bct")
    first, second = data.scenario.steps
    old = pipeline._new_model(method, cfg, data, len(first.seen_classes), 1).frozen_copy()
    net = pipeline._next_model(method, cfg, data, old, len(second.seen_classes), 2, False)
    before = {k: v.clone() for k, v in net.state_dict().items()}
    images, labels = data.train_images(second, False, seed=cfg.seed)
    seen = len(second.seen_classes)
    ctx = StepContext(step=2, seen_classes=tuple(range(seen)), new_classes=tuple(range(len(first.seen_classes), seen)),
                      old_model=old)
    epochs = []
    history = train_step_parallel(net, method, images, labels, ctx, cfg.training, device=torch.device("cpu"), seed=3,
                                  augment_images=False, nproc=2, rank_states=tmp_path,
                                  hooks=pipeline.Hooks(on_epoch=lambda e, n, parts: epochs.append((e, n))))
    ranks = [load_file(str(tmp_path / f"rank_{r}.safetensors")) for r in (0, 1)]
    assert ranks[0].keys() == ranks[1].keys() == before.keys()
    for name in before:
        assert torch.equal(ranks[0][name], ranks[1][name]), name
        assert torch.equal(net.state_dict()[name], ranks[0][name]), name  # the caller got rank 0's weights
    assert not torch.equal(ranks[0]["head.fc.weight"], before["head.fc.weight"])  # it trained
    assert ranks[0]["backbone.layers.0.1.num_batches_tracked"].item() == len(labels) // 64  # one update per global batch
    assert epochs == [(1, 1)] and set(history[0]) >= {"loss"} and np.isfinite(history[0]["loss"])


@needs_two
def test_two_processes_store_what_one_process_stores_with_the_same_effective_batch(tmp_path):
    """1 process x batch 64 against 2 processes x batch 32: the same global batches, gradients and BatchNorm
    statistics, so the same models up to float32 summation order (all-reduce of two half-batch sums against one
    64-sample reduction, ~1e-7 per step, grown by momentum SGD to ~1e-4 on features of size ~1): they agree to
    1e-3 absolute, not bit for bit, while one process with batch 32 (another effective batch) is far off."""
    stored = []
    for nproc, batch in ((1, 64), (2, 32), (1, 32)):
        name = f"{nproc}x{batch}"
        ctx = RunContext(get_engine(f"sqlite:///{tmp_path / name}.sqlite"), tmp_path / name, nproc=nproc)
        exp_id = run_experiment(_cfg(batch, **DISTILL), ctx)
        with session_scope(ctx.db) as s:
            versions = list_model_versions(s, exp_id)
            stored.append({(v.step, split, view): load_feature_set(s, v.id, split, view)[:2]
                           for v in versions for split in ("query", "gallery") for view in ("encoder", "logits")})
        checkpoints = sorted(p.name for p in (tmp_path / name).rglob("*.safetensors"))
        assert checkpoints == ["step_1.safetensors", "step_2.safetensors"]  # written once, by the calling process
    one, two, other_batch = stored
    assert one.keys() == two.keys() and len(one) == 8
    for key in one:
        np.testing.assert_array_equal(one[key][1], two[key][1])  # labels
        np.testing.assert_allclose(two[key][0], one[key][0], rtol=0, atol=1e-3, err_msg=str(key))
    assert max(np.abs(other_batch[k][0] - one[k][0]).max() for k in one) > 1e-2  # the tolerance tells batches apart


@needs_two
def test_a_stop_asked_reaches_every_rank_and_the_caller_gets_cancelled(tmp_path):
    cfg = _cfg(32, methods=["independent"])
    data = prepare_run_data(cfg)
    method = build_method("independent")
    step = data.scenario.steps[0]
    net = pipeline._new_model(method, cfg, data, len(step.seen_classes), 1)
    before = {k: v.clone() for k, v in net.state_dict().items()}
    images, labels = data.train_images(step, False, seed=0)
    ctx = StepContext(step=1, seen_classes=tuple(range(5)), new_classes=tuple(range(5)))
    with pytest.raises(Cancelled, match="cancelled during step 1, epoch 1"):
        train_step_parallel(net, method, images, labels, ctx, cfg.training, device=torch.device("cpu"), seed=0,
                            augment_images=False, nproc=2, rank_states=tmp_path, hooks=pipeline.Hooks(should_stop=lambda: True))
    assert not list(tmp_path.iterdir())  # no rank wrote weights
    assert all(torch.equal(net.state_dict()[k], v) for k, v in before.items())  # the caller's model is untouched


@pytest.mark.parametrize("nproc", [0, -1, available_processes(torch.device("cpu")) + 1])
def test_an_impossible_process_count_is_refused_in_one_line(tmp_path, capsys, nproc):
    path = tmp_path / "c.toml"
    path.write_text('methods = ["independent"]\n[dataset]\nname = "digits"\n[scenario]\ninitial_classes = 5\n'
                    'increment = 5\nnum_steps = 2\n[model]\nbackbone = "small_cnn"\nwidth = 8\n')
    db = tmp_path / "db.sqlite"
    code = main(["run", str(path), "--device", "cpu", "--db", f"sqlite:///{db}", "--quiet", "--nproc", str(nproc)])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and err.startswith(f"error: --nproc {nproc} is not possible here")
    assert not db.exists()  # refused before the database was touched


def test_group_batchnorm_is_batchnorm_on_one_process():
    """Outside a process group (and in eval mode) it is plain BatchNorm, same names, same numbers."""
    torch.manual_seed(0)
    ref = torch.nn.BatchNorm2d(3)
    mine = GroupBatchNorm(3)
    mine.load_state_dict(ref.state_dict())
    x = torch.randn(5, 3, 4, 4)
    torch.testing.assert_close(mine(x), ref(x))
    assert mine.state_dict().keys() == ref.state_dict().keys()
    torch.testing.assert_close(mine.running_var, ref.running_var)
