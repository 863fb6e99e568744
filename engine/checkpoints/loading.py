"""Load a user's checkpoint without executing code from it, and validate it before anything runs.

What is accepted is decided by the file's content, not its extension:

* **TorchScript archive** (zip with ``code/`` and ``constants.pkl``). The archive carries its own
  architecture. ``forward(x)`` may return the logits, a ``(features, logits)`` pair or a dict with
  ``"features"`` and ``"logits"``; a module that returns only logits may export ``embed(x)``
  (``@torch.jit.export``) for the encoder view, otherwise it has no encoder view (its encoder
  cross-tests are reported as not comparable).
* **state_dict** written by ``torch.save`` (``.pt``/``.pth``, zip format), read with
  ``torch.load(..., weights_only=True)`` and nothing else; or a ``.safetensors`` file. It needs an
  architecture from ``ARCHITECTURES`` and is loaded strictly. A ``module.`` prefix on every key
  (DataParallel) is removed, and a dict that wraps the weights under ``state_dict``,
  ``model_state_dict``, ``model`` or ``net`` is unwrapped.
* **the project's own step checkpoints** (safetensors with a ``compatibility-lab/net/1`` header),
  loaded by ``engine.models.load_checkpoint``.

The file checks and the trust model are in ``engine.checkpoints.files``; reading and checking the tensors in
``engine.checkpoints.tensors``. Every refusal is a ``CheckpointError``, a ``ValueError`` with one line
``PATH: reason``.
"""
from __future__ import annotations

import json
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path

import torch
from torch import nn

from engine.checkpoints.archs import ARCHITECTURES, Architecture
from engine.checkpoints.files import (
    DEFAULT_MAX_BYTES,
    LOCAL,
    TORCHSCRIPT_REFUSED,
    CheckpointError,
    Trust,
    check_zip_sizes,
    first_line,
    human_bytes,
    server_max_bytes,
    sha256_of,
    sniff,
)
from engine.checkpoints.sandbox import SandboxedScript, SandboxError, scan_archive
from engine.checkpoints.tensors import (
    as_state_dict,
    check_model_bytes,
    check_tensors,
    on_meta,
    read_safetensors,
    torch_load,
    with_bn_counters,
)
from engine.checkpoints.torch_zip import check_torch_zip
from engine.core.contract import CHECKPOINT_FORMAT
from engine.data.roots import confine
from engine.models import LinearHead, ModelOutput, ModelSpec, build_from_spec, load_checkpoint

KINDS = ("torchscript", "state_dict", "project")


# --- what the engine evaluates ---------------------------------------------------------------


class OutputColumns(nn.Module):
    """The head interface ``extract_outputs`` reads from a model whose output count is learnt by running it."""

    def __init__(self, num_outputs: int = 0) -> None:
        super().__init__()
        self.num_outputs = num_outputs

    def class_to_output(self, labels: torch.Tensor) -> torch.Tensor:
        return labels


class SplitClassifier(nn.Module):
    """A classifier cut at its final Linear: ``forward`` returns ``ModelOutput(features, logits)``."""

    def __init__(self, model: nn.Module, classifier: str) -> None:
        super().__init__()
        linear = model.get_submodule(classifier)
        if not isinstance(linear, nn.Linear):
            raise TypeError(f"{classifier!r} is a {type(linear).__name__}, not a Linear")
        model.set_submodule(classifier, nn.Identity())
        self.backbone = model
        self.head = LinearHead(linear.in_features, linear.out_features, bias=linear.bias is not None)
        self.head.fc = linear

    def forward(self, x: torch.Tensor) -> ModelOutput:
        features = self.backbone(x).flatten(1)
        return ModelOutput(features, self.head(features))


class ScriptedClassifier(nn.Module):
    """A TorchScript archive running in its contained process, seen as ``ModelOutput(features, logits)``.

    A model without features gives a (batch, 0) tensor. Batches go to the process on the CPU and the
    outputs come back to the input's device.
    """

    def __init__(self, script: SandboxedScript) -> None:
        super().__init__()
        self.script = script
        self.has_embed = script.has_embed
        self.head = OutputColumns()

    def forward(self, x: torch.Tensor) -> ModelOutput:
        features, logits = self.script(x.detach().float().cpu().numpy())
        return ModelOutput(torch.from_numpy(features).to(x.device), torch.from_numpy(logits).to(x.device))

    def close(self) -> None:
        """Stop the contained process (also done when the model is garbage-collected)."""
        self.script.close()


@dataclass
class LoadedModel:
    """A validated network ready for ``extract_outputs``, with what is known about its inputs.

    ``num_outputs`` is ``None`` for TorchScript until :func:`engine.checkpoints.compare` has run it
    once. ``input_size`` ``None`` means: the evaluation images' own size (32 px for an image folder).
    """

    path: Path
    kind: str
    architecture: str
    net: nn.Module
    num_outputs: int | None
    input_size: int | None
    mean: tuple[float, ...] | None
    std: tuple[float, ...] | None
    in_channels: int | None
    sha256: str



# --- loading ---------------------------------------------------------------------------------


def _check_declared(path: Path, found: int, declared: int | None, where: str) -> None:
    if declared is not None and found != declared:
        raise CheckpointError(path, f"{where} has {found} outputs but {declared} classes were declared")



def load_model(path: str | Path, *, arch: str | None = None, num_classes: int | None = None,
               max_bytes: int = DEFAULT_MAX_BYTES, trust: Trust = LOCAL) -> LoadedModel:
    """Read, validate and build the network in ``path`` (CPU); never executes code from it in this process.

    ``arch`` is required for a plain state_dict and refused for TorchScript archives and project
    checkpoints, which carry their architecture. ``num_classes`` (optional) must match the
    classifier; for a state_dict it is otherwise read from the classifier weight. ``trust`` says
    whether the path is confined to the data roots and whether TorchScript may run (contained).
    """
    if trust.confine:
        path = confine(path, what="checkpoint")
        max_bytes = min(max_bytes, server_max_bytes())  # the operator's limit is a ceiling for dashboard jobs
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(path, "file not found" if not path.exists() else "is not a file")
    size = path.stat().st_size
    if size == 0:
        raise CheckpointError(path, "is empty (0 bytes)")
    if size > max_bytes:
        raise CheckpointError(path, f"is {human_bytes(size)}, over the {human_bytes(max_bytes)} size limit "
                                    "(raise it with --max-size or max_file_bytes)")
    if num_classes is not None and num_classes < 1:
        raise CheckpointError(path, f"the number of classes must be positive, got {num_classes}")
    fmt = sniff(path)
    if fmt in ("torchscript", "torch") and zipfile.is_zipfile(path):  # not the shipped legacy weights (see _shipped)
        check_zip_sizes(path, max_bytes)
    digest = sha256_of(path)
    if fmt == "torchscript":
        _no_arch(path, arch, "a TorchScript archive")
        if not trust.torchscript:
            raise CheckpointError(path, TORCHSCRIPT_REFUSED)
        return _load_torchscript(path, num_classes, digest, trust)
    if fmt == "safetensors":
        tensors, metadata = read_safetensors(path, max_bytes)
        if metadata.get("format") == CHECKPOINT_FORMAT:
            _no_arch(path, arch, "a Compatibility Lab step checkpoint")
            return _load_project(path, tensors, metadata, num_classes, digest, max_bytes)
    else:
        if zipfile.is_zipfile(path):  # every tensor's shape and strides checked before torch.load allocates it
            check_torch_zip(path, max_bytes)
        tensors = as_state_dict(path, torch_load(path))
    return _load_state_dict(path, tensors, arch, num_classes, digest, max_bytes)


def _no_arch(path: Path, arch: str | None, what: str) -> None:
    if arch:
        raise CheckpointError(path, f"is {what}, which carries its own architecture: give it as PATH or "
                                    f"PATH::NUM_CLASSES, without {arch!r}")


def _load_torchscript(path: Path, num_classes: int | None, digest: str, trust: Trust) -> LoadedModel:
    try:
        if trust.scan:
            scan_archive(path)
        script = SandboxedScript(path, require_landlock=trust.require_landlock, model_errors=trust.model_errors)
    except SandboxError as exc:
        raise CheckpointError(path, str(exc)) from None
    except zipfile.BadZipFile as exc:
        raise CheckpointError(path, f"is a truncated or corrupt zip archive ({first_line(exc)})") from None
    return LoadedModel(path, "torchscript", "torchscript", ScriptedClassifier(script), num_classes,
                       None, None, None, None, digest)


def _load_project(path: Path, tensors: dict[str, torch.Tensor], metadata: Mapping[str, str],
                  num_classes: int | None, digest: str, max_bytes: int) -> LoadedModel:
    try:
        meta = json.loads(metadata["meta"])
        unknown = sorted(set(meta) - {f.name for f in fields(ModelSpec)})
        if unknown:
            raise ValueError(f"unknown architecture fields {unknown} (written by a newer version?)")
        spec = ModelSpec(**meta)
        try:
            shell = on_meta(lambda: build_from_spec(spec))  # its sizes, before anything is allocated
        except NotImplementedError:  # a head that computes from its own weights when built: sized for real
            shell = build_from_spec(spec)
    except (KeyError, TypeError, ValueError, json.JSONDecodeError) as exc:
        raise CheckpointError(path, f"has an unreadable architecture header ({first_line(exc)})") from None
    _check_declared(path, spec.num_classes, num_classes, f"its {spec.head} head")
    what = f"{spec.backbone} network with a {spec.num_classes}-output {spec.head} head"
    check_model_bytes(path, shell, max_bytes, what=what)
    check_tensors(path, shell, tensors, what=what)
    net = load_checkpoint(path)
    return LoadedModel(path, "project", spec.backbone, net, net.head.num_outputs, None, None, None,
                       spec.in_channels, digest)


def _architecture(path: Path, arch: str | None) -> Architecture:
    known = ", ".join(sorted(ARCHITECTURES))
    if not arch:
        raise CheckpointError(path, f"is a plain state_dict: name its architecture as PATH:ARCH[:NUM_CLASSES] (known: {known})")
    if arch not in ARCHITECTURES:
        raise CheckpointError(path, f"unknown architecture {arch!r}; known architectures: {known}")
    return ARCHITECTURES[arch]


def _shell(entry: Architecture, classes: int, tensors: dict[str, torch.Tensor]) -> nn.Module:
    """The classifier ``entry`` builds, on meta tensors; for a builder that reads its own initial weights (torchvision's
    RegNets), its one-class build with a meta classifier of ``classes`` outputs (the rest is fixed-size)."""
    try:
        return on_meta(lambda: entry.build(classes, tensors))
    except NotImplementedError:
        model = entry.build(1, tensors)
        old = model.get_submodule(entry.classifier)
        model.set_submodule(entry.classifier, on_meta(lambda: nn.Linear(old.in_features, classes, bias=old.bias is not None)))
        return model


def _load_state_dict(path: Path, tensors: dict[str, torch.Tensor], arch: str | None, num_classes: int | None,
                     digest: str, max_bytes: int = DEFAULT_MAX_BYTES) -> LoadedModel:
    entry = _architecture(path, arch)
    classifier = tensors.get(f"{entry.classifier}.weight")
    found = int(classifier.shape[0]) if classifier is not None and classifier.ndim == 2 else None
    if found is not None:
        _check_declared(path, found, num_classes, f"its classifier {entry.classifier}.weight")
    classes = num_classes or found
    what = f"{arch} with {classes} classes" if classes else str(arch)
    try:  # first without memory (meta tensors): its size and every key and shape, then for real
        shell = _shell(entry, classes or 1, tensors)
        check_model_bytes(path, shell, max_bytes, what=what)
        check_tensors(path, shell, with_bn_counters(shell, tensors), what=what)
        model = entry.build(classes or 1, tensors)
    except ValueError as exc:
        if isinstance(exc, CheckpointError):
            raise
        raise CheckpointError(path, f"cannot build a {arch} for these weights ({first_line(exc)})") from None
    tensors = with_bn_counters(model, tensors)
    model.load_state_dict(tensors, strict=True)
    model.eval()
    net = model if entry.project else SplitClassifier(model, entry.classifier)
    in_channels = model.spec.in_channels if entry.project else entry.in_channels
    return LoadedModel(path, "state_dict", arch, net, net.head.num_outputs, entry.input_size, entry.mean, entry.std,
                       in_channels, digest)
