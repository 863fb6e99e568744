"""Ablation: PSP/LSP with and without paper 000's "temperature factor of 12", in training and at extraction.

One small class-incremental sequence (Fashion-MNIST 4+3+3, 100 training / 50 test images per class,
small CNN) is trained with cross-entropy on logits / T for T = 12 (paper 000, A.9) and T = 1; each is
evaluated with the stored softmax plain (``extraction_temperature = "none"``, Eq. 2, the default) and at the
training temperature (``"training"``). Every combination runs as an engine study (``engine.run.pipeline.run_study``,
methods psp + lsp trained once per seed) and is summarised by ``engine.results.study_summary`` (Recall@1, AC/AA/ACA,
mean ± std over the seeds). LSP is scale-invariant, so its rows differ only by the training temperature; at
T = 1 both extraction settings store the same softmax, so that combination is not run again (its rows repeat
the "none" ones).

    python bench/ablation_psp_temperature.py               # seeds 0 1, 5 epochs (about 4.5 CPU-minutes)
    python bench/ablation_psp_temperature.py --seeds 0 1 2 --epochs 10
    python bench/ablation_psp_temperature.py --dataset digits   # when Fashion-MNIST is absent
"""
from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from engine.core.config import RunConfig, config_from_dict
from engine.run.pipeline import RunContext, run_study
from engine.results.study_summary import header, study_summary
from storage import get_engine

TRAINING_TEMPERATURES = (12.0, 1.0)
EXTRACTIONS = ("none", "training")
METRIC = "recall@1"


def ablation_config(dataset: str, training_temperature: float, extraction: str, seeds: list[int], epochs: int) -> RunConfig:
    """The study of one (training temperature, extraction setting) combination."""
    params = {"temperature": training_temperature, "extraction_temperature": extraction}
    return config_from_dict({
        "name": f"psp temperature T={training_temperature:g}, extraction {extraction}",
        "dataset": {"name": dataset, "train_per_class": 100, "test_per_class": 50, "max_per_class": 100},
        "scenario": {"initial_classes": 4, "increment": 3, "num_steps": 3},
        "model": {"backbone": "small_cnn", "width": 16},
        "training": {"epochs": epochs, "batch_size": 32, "lr": 0.1},
        "eval": {"eval_classes": "seen"},  # cross-tests on the classes both models know (Recall@1, instance gallery)
        "methods": ["psp", "lsp"], "method_params": {"psp": params, "lsp": params},
        "seed": seeds[0], "seeds": seeds,
    })


def _cell(spread: dict, key: str, scale: float) -> str:
    s = spread[key]
    if s["mean"] is None:
        return "-"
    std = f" ± {scale * s['std']:.2f}" if s["std"] is not None else ""
    return f"{scale * s['mean']:.2f}{std}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dataset", default="fashion", choices=("fashion", "digits"))
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    ap.add_argument("--epochs", type=int, default=5)
    args = ap.parse_args()
    rows, first = [], None
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        ctx = RunContext(get_engine(f"sqlite:///{tmp}/db.sqlite"), Path(tmp) / "ckpt")
        for t in TRAINING_TEMPERATURES:
            for extraction in EXTRACTIONS:
                if t == 1.0 and extraction == "training":  # softmax(z / 1): the study just run, identical
                    rows += [r.replace("| none |", "| training (= none) |") for r in rows[-2:]]
                    continue
                study_id, ids = run_study(ablation_config(args.dataset, t, extraction, args.seeds, args.epochs), ctx)
                summary = study_summary(ctx.db, study_id, ids)
                first = first or summary
                for method in ("psp", "lsp"):
                    spread = summary["methods"][method]["spread"][method][METRIC]
                    rows.append(f"| {t:g} | {extraction} | {method.upper()} | {_cell(spread, 'AC', 1)} | "
                                f"{_cell(spread, 'AA', 100)} | {_cell(spread, 'ACA', 100)} |")
    print(f"{args.dataset} 4+3+3, 100 train / 50 test per class, small_cnn width 16, {args.epochs} epochs; "
          f"{header(first, METRIC)}")
    print("| training T | extraction | view | AC | AA (%) | ACA (%) |\n|---|---|---|---|---|---|")
    print("\n".join(rows))
    print(f"mean ± std over seeds {', '.join(map(str, args.seeds))}; wall {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
