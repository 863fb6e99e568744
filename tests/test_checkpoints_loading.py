"""Loading user checkpoints: every accepted format, refusal of code-running pickles, one-line errors."""
from __future__ import annotations

import pickle
import zipfile

import numpy as np
import pytest
import torch
from safetensors.torch import save_file
from support.checkpoints_factory import (
    TinyLogits,
    TinyLogitsEmbed,
    TinyPair,
    save_resnet18_safetensors,
    save_state_dict_pt,
    save_step_checkpoint,
    save_torchscript,
    small_net,
)

from engine.core.classes import aligned_columns, read_class_list
from engine.cli.options import parse_model_arg
from engine.checkpoints.files import CheckpointError, parse_size
from engine.checkpoints.loading import load_model

X = torch.rand(3, 3, 16, 16, generator=torch.Generator().manual_seed(0))


def _outputs(loaded):
    with torch.inference_mode():
        return loaded.net.eval()(X)


# --- accepted formats ------------------------------------------------------------------------


def test_state_dict_pt_loads_strictly_into_the_project_backbone(tmp_path):
    net = save_state_dict_pt(tmp_path / "m.pt", num_classes=5, width=12).eval()
    loaded = load_model(tmp_path / "m.pt", arch="small_cnn")
    assert (loaded.kind, loaded.architecture, loaded.num_outputs, loaded.in_channels) == ("state_dict", "small_cnn", 5, 3)
    out = _outputs(loaded)
    assert torch.equal(out.logits, net(X).logits) and out.features.shape == (3, 12)


def test_safetensors_state_dict_of_torchvision_resnet18_is_cut_at_its_classifier(tmp_path):
    model = save_resnet18_safetensors(tmp_path / "r.safetensors", num_classes=3)
    loaded = load_model(tmp_path / "r.safetensors", arch="resnet18", num_classes=3)
    out = _outputs(loaded)
    assert out.features.shape == (3, 512)
    torch.testing.assert_close(out.logits, model(X))
    assert (loaded.input_size, loaded.mean) == (224, (0.485, 0.456, 0.406))


def test_project_step_checkpoint_needs_no_architecture(tmp_path):
    net = save_step_checkpoint(tmp_path / "step_1.safetensors", num_classes=4, width=8).eval()
    loaded = load_model(tmp_path / "step_1.safetensors", num_classes=4)
    assert (loaded.kind, loaded.architecture, loaded.num_outputs) == ("project", "small_cnn", 4)
    assert torch.equal(_outputs(loaded).logits, net(X).logits)


@pytest.mark.parametrize("module, trace, dim", [(TinyPair(), False, 6), (TinyPair(), True, 6),
                                                (TinyLogitsEmbed(), False, 6), (TinyLogits(), True, 0)],
                         ids=["script-pair", "trace-pair", "script-embed", "trace-logits-only"])
def test_torchscript_forms(tmp_path, module, trace, dim):
    save_torchscript(tmp_path / "ts.pt", module, trace=trace)
    loaded = load_model(tmp_path / "ts.pt")
    out = _outputs(loaded)
    expected = module(X)
    logits = expected[1] if isinstance(expected, tuple) else expected
    torch.testing.assert_close(out.logits, logits)
    assert out.features.shape == (3, dim)  # 0: logits only, no encoder view
    assert loaded.kind == "torchscript" and loaded.input_size is None


def test_dataparallel_prefix_and_wrapping_dict_are_accepted(tmp_path):
    net = small_net(4, width=8).eval()
    torch.save({"epoch": 3, "state_dict": {f"module.{k}": v for k, v in net.state_dict().items()}}, tmp_path / "w.pth")
    assert torch.equal(_outputs(load_model(tmp_path / "w.pth", arch="small_cnn")).logits, net(X).logits)


# --- code in the file never runs ------------------------------------------------------------


class Payload:
    """Unpickling this runs exec(...), which writes a marker file: what a malicious checkpoint does."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return exec, (f"open({self.marker!r}, 'w').write('code ran')",)


def test_the_payload_is_live_when_unpickled_by_python(tmp_path):
    pickle.loads(pickle.dumps(Payload(tmp_path / "ran")))  # what weights_only=False would do
    assert (tmp_path / "ran").read_text() == "code ran"


@pytest.mark.parametrize("how", ["torch-zip", "torch-legacy", "raw-pickle"])
def test_malicious_pickle_is_refused_and_nothing_runs(tmp_path, how):
    marker, path = tmp_path / "marker", tmp_path / "evil.pt"
    state = {"backbone.w": torch.zeros(2), "payload": Payload(marker)}
    if how == "raw-pickle":
        path.write_bytes(pickle.dumps(Payload(marker), protocol=2))
    else:
        torch.save(state, path, _use_new_zipfile_serialization=how == "torch-zip")
    expected = (r"refused: unpickling it would call exec.*nothing from the file was run" if how == "torch-zip"
                else r"is in torch's legacy \(pre-1.6\) format.*re-save it")  # a bare pickle is refused before it is read
    with pytest.raises(CheckpointError, match=r"evil\.pt: " + expected):
        load_model(path, arch="small_cnn")
    assert not marker.exists()


def test_whole_pickled_model_is_refused_with_its_class_named(tmp_path):
    torch.save(small_net(3), tmp_path / "model.pt")
    with pytest.raises(CheckpointError, match=r"refused: unpickling it would call engine\.models\.net\.Net.*state_dict"):
        load_model(tmp_path / "model.pt", arch="small_cnn")


def test_torchscript_archive_with_a_forged_malicious_data_pkl_is_refused(tmp_path):
    save_torchscript(tmp_path / "ts.pt", TinyPair())
    marker = tmp_path / "marker"
    with zipfile.ZipFile(tmp_path / "ts.pt") as src, zipfile.ZipFile(tmp_path / "forged.pt", "w") as dst:
        for name in src.namelist():
            data = src.read(name)
            dst.writestr(name, pickle.dumps(Payload(marker), protocol=2) if name.endswith("/data.pkl") else data)
    with pytest.raises(CheckpointError, match=r"forged\.pt: cannot be loaded as TorchScript"):
        load_model(tmp_path / "forged.pt")
    assert not marker.exists()


# --- malformed files: one line naming the file and the reason --------------------------------


def _sd(**changes):
    state = dict(small_net(4, width=8).state_dict())
    for key, value in changes.items():
        if value is None:
            state.pop(key.replace("__", "."))
        else:
            state[key.replace("__", ".")] = value
    return state


def _write_pt(state):
    return lambda p: torch.save(state, p)


def _truncate(write):
    def make(p):
        write(p)
        data = p.read_bytes()
        p.write_bytes(data[: len(data) // 2])
    return make


MALFORMED = {
    "missing key": (_write_pt(_sd(head__fc__weight=None)), {"arch": "small_cnn", "num_classes": 4},
                    "does not match a small_cnn with 4 classes: 1 missing key(s): head.fc.weight"),
    "unexpected key": (_write_pt({**_sd(), "extra.weight": torch.zeros(2)}), {"arch": "small_cnn"},
                       "1 unexpected key(s): extra.weight"),
    "shape mismatch": (_write_pt(_sd(backbone__layers__1__0__weight=torch.zeros(8, 8, 1, 1))), {"arch": "small_cnn"},
                       "shape mismatch in layer backbone.layers.1.0.weight: a small_cnn with 4 classes expects "
                       "(8, 8, 3, 3), the file has (8, 8, 1, 1)"),
    "classifier size": (_write_pt(_sd()), {"arch": "small_cnn", "num_classes": 10},
                        "its classifier head.fc.weight has 4 outputs but 10 classes were declared"),
    "nan weights": (_write_pt(_sd(backbone__layers__0__0__weight=torch.full((8, 3, 3, 3), float("nan")))),
                    {"arch": "small_cnn"}, "has NaN/inf weights in 1 tensor(s): backbone.layers.0.0.weight (216 of 216)"),
    "inf weights": (_write_pt(_sd(head__fc__weight=torch.full((4, 8), float("inf")))), {"arch": "small_cnn"},
                    "has NaN/inf weights in 1 tensor(s): head.fc.weight"),
    "empty": (lambda p: p.write_bytes(b""), {"arch": "small_cnn"}, "is empty (0 bytes)"),
    "truncated zip": (_truncate(_write_pt(_sd())), {"arch": "small_cnn"}, "is a truncated or corrupt zip archive"),
    "truncated legacy": (_truncate(lambda p: torch.save(_sd(), p, _use_new_zipfile_serialization=False)),
                         {"arch": "small_cnn"}, "legacy (pre-1.6) format"),
    "truncated safetensors": (_truncate(lambda p: save_file(_sd(), str(p))), {"arch": "small_cnn"},
                              "truncated or corrupt"),
    "over size limit": (_write_pt(_sd()), {"arch": "small_cnn", "max_bytes": 1000},
                        "over the 1.0 KB size limit (raise it with --max-size or max_file_bytes)"),
    "unknown architecture": (_write_pt(_sd()), {"arch": "resnet9000"},
                             "unknown architecture 'resnet9000'; known architectures: alexnet,"),
    "no architecture": (_write_pt(_sd()), {}, "is a plain state_dict: name its architecture as PATH:ARCH[:NUM_CLASSES]"),
    "wrong architecture": (_write_pt(_sd()), {"arch": "resnet18"}, "does not match a resnet18"),
    "not a state_dict": (_write_pt([torch.zeros(1)]), {"arch": "small_cnn"}, "holds a list, not a state_dict"),
    "not tensors": (_write_pt({"a": 1, "b": "x"}), {"arch": "small_cnn"}, "holds entries that are not tensors: a (int), b (str)"),
    "not a checkpoint": (lambda p: p.write_text("hello"), {"arch": "small_cnn"}, "is not a checkpoint format this engine reads"),
    "arch for torchscript": (lambda p: save_torchscript(p, TinyPair()), {"arch": "resnet18"},
                             "is a TorchScript archive, which carries its own architecture"),
}


@pytest.mark.parametrize("case", MALFORMED)
def test_malformed_checkpoint_one_line_error_naming_the_file(tmp_path, case):
    write, kwargs, message = MALFORMED[case]
    path = tmp_path / "bad.pt"
    write(path)
    with pytest.raises(CheckpointError) as info:
        load_model(path, **kwargs)
    text = str(info.value)
    assert text.startswith(f"{path}: ") and "\n" not in text
    assert message in text, text


def test_missing_file(tmp_path):
    with pytest.raises(CheckpointError, match="nope.pt: file not found"):
        load_model(tmp_path / "nope.pt", arch="small_cnn")


# --- command-line pieces, class lists ----------------------------------------------------------


def test_model_argument_syntax(tmp_path):
    assert parse_model_arg("old.pt:resnet18:100") == {"path": "old.pt", "arch": "resnet18", "num_classes": 100}
    assert parse_model_arg("old.pt:resnet18") == {"path": "old.pt", "arch": "resnet18", "num_classes": None}
    assert parse_model_arg("new.pt") == {"path": "new.pt", "arch": None, "num_classes": None}
    assert parse_model_arg("new.pt::7") == parse_model_arg("new.pt:7") == {"path": "new.pt", "arch": None, "num_classes": 7}
    odd = tmp_path / "a:b.pt"
    odd.write_bytes(b"x")
    assert parse_model_arg(f"{odd}:small_cnn")["path"] == str(odd)  # an existing file wins over the split
    assert parse_model_arg("pretrained:efficientnet_lite0") == {"path": "pretrained:efficientnet_lite0"}
    with pytest.raises(ValueError, match="NUM_CLASSES must be a positive integer, got 'x'"):
        parse_model_arg("old.pt:resnet18:x")


def test_size_limit_syntax():
    assert parse_size("2GB") == 2_000_000_000 and parse_size("500m") == 500_000_000 and parse_size(1234) == 1234
    with pytest.raises(ValueError, match="not understood"):
        parse_size("lots")


def test_class_lists_from_file_text_or_list(tmp_path):
    (tmp_path / "c.txt").write_text("cat\ndog\n\nfox\n")
    assert read_class_list(str(tmp_path / "c.txt")) == ("cat", "dog", "fox")
    assert read_class_list("cat, dog,fox") == ("cat", "dog", "fox") == read_class_list(["cat", "dog", "fox"])
    with pytest.raises(ValueError, match="more than once: dog"):
        read_class_list("cat,dog,dog")
    with pytest.raises(ValueError, match="not found"):
        read_class_list(str(tmp_path / "missing.txt"))


def test_alignment_is_the_shared_classes_in_the_gallery_models_order():
    q, g = aligned_columns(["d", "a", "x", "b"], ["a", "b", "c", "d"])
    assert q.tolist() == [1, 3, 0] and g.tolist() == [0, 1, 3]  # a, b, d in the gallery's order; c unknown to query
    q, g = aligned_columns([str(i) for i in range(6)], [str(i) for i in range(4)])
    assert q.tolist() == g.tolist() == [0, 1, 2, 3]  # nested index names: the paper's "first C^k outputs"
    assert len(aligned_columns(["a"], ["b"])[0]) == 0
    assert np.asarray(aligned_columns(["a", "b"], ["b", "a"])[0]).tolist() == [1, 0]


def test_pretrained_torchvision_name_uses_the_hub_cache_and_never_downloads(tmp_path, monkeypatch):
    import torchvision

    from engine.checkpoints.request import model_source

    monkeypatch.setattr(torch.hub, "get_dir", lambda: str(tmp_path))
    with pytest.raises(ValueError, match=r"pretrained:resnet18: the torchvision ImageNet weights are not on this machine"):
        model_source({"path": "pretrained:resnet18"})
    (tmp_path / "checkpoints").mkdir()
    torch.save(torchvision.models.resnet18(weights=None).state_dict(), tmp_path / "checkpoints" / "resnet18-f37072fd.pth")
    source = model_source({"path": "pretrained:resnet18"})
    assert (source.arch, source.num_classes) == ("resnet18", 1000)
    assert load_model(source.path, arch=source.arch, num_classes=source.num_classes).num_outputs == 1000
