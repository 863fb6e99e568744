"""What a form needs before it enqueues a job (torch-free): the comparison request's grammar and presets
(``engine.checkpoints.request``, ``presets``, ``arch_table``, ``pretrained``), the cheap checks on a checkpoint file
or a text model's folder without loading it (``engine.checkpoints.files``, ``torch_zip``,
``engine.data.text_model_files``), the data roots every path a person names must stay in (``engine.data.roots``), the
WordNet corpus's options (``engine.data.wordnet``), and a run config's scenario and data files
(``engine.data.scenario``, ``fashion_files``, ``files_present``).

Each name is defined and tested where the engine computes it; the pages import it from here."""
from __future__ import annotations

from engine.checkpoints.arch_table import ARCH_INPUTS
from engine.checkpoints.files import (TORCHSCRIPT_REFUSED, CheckpointError, check_ceiling, human_bytes, parse_size,
                                      safetensors_metadata, server_max_bytes, server_trust, sniff)
from engine.checkpoints.presets import TEXT_UPGRADE, comparison_preset
from engine.checkpoints.pretrained import LITE_WEIGHT_PACKAGES
from engine.checkpoints.request import TEXT_ARCH, comparison_spec, parse_dataset, source_name, text_corpus
from engine.checkpoints.torch_zip import check_torch_zip
from engine.data.fashion_files import fashion_available
from engine.data.files_present import config_files_problem
from engine.data.roots import OutsideRootsError, confine, sqlite_folder, torchscript_allowed
from engine.data.scenario import build_scenario
from engine.data.text_model_files import TEXT_MODEL_FILES, ModelFolder, TextModelError, weights_member
from engine.data.wordnet import TASKS as WORDNET_TASKS, parse_options

__all__ = ["ARCH_INPUTS", "TORCHSCRIPT_REFUSED", "CheckpointError", "check_ceiling", "human_bytes", "parse_size",
           "safetensors_metadata", "server_max_bytes", "server_trust", "sniff", "TEXT_UPGRADE", "comparison_preset",
           "LITE_WEIGHT_PACKAGES", "TEXT_ARCH", "comparison_spec", "parse_dataset", "source_name", "text_corpus",
           "check_torch_zip", "fashion_available", "config_files_problem", "OutsideRootsError", "confine",
           "sqlite_folder", "torchscript_allowed", "build_scenario", "TEXT_MODEL_FILES", "ModelFolder",
           "TextModelError", "weights_member", "WORDNET_TASKS", "parse_options"]
