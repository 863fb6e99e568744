"""A text encoder on the GPU against the same encoder on the CPU, in one run: texts/s each, their ratio, and how close
the embeddings are (the CUDA path must compute what the CPU path computes).

Usage: ``python bench/bench_text_cuda.py --folder MODEL_DIR --texts TEXTS.json [--reference]``

``MODEL_DIR`` is a sentence-transformers folder (``config.json``, ``tokenizer.json``, ``model.safetensors``: the torch
BERT of ``engine.models.bert``; or ``model.onnx``: onnxruntime, CUDA provider when it has one), read as data like a
user's ``PATH:text`` model. ``TEXTS.json`` is a JSON list of strings. ``--reference`` also embeds the texts with
sentence-transformers when it is installed (an independent implementation of the same model) and prints the cosine
of each path to it. Prints onnxruntime's providers, so a run says whether the CUDA provider could be used at all.
"""
from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import numpy as np
import torch

from engine.data.text_model_files import ModelFolder
from engine.models.text_encoder import load_text_folder


def timed_encode(folder: Path, texts: list[str], device: str, batch_size: int) -> tuple[np.ndarray, float]:
    """The texts' embeddings on ``device`` and the seconds the encode took (after one warm-up batch)."""
    encoder = load_text_folder(ModelFolder(folder), name=folder.name, device=device)
    try:
        encoder.encode(texts[:batch_size], batch_size=batch_size)  # warm-up: kernels, allocator, thread pool
        if device == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        out = encoder.encode(texts, batch_size=batch_size)
        if device == "cuda":
            torch.cuda.synchronize()
        return out, time.perf_counter() - start
    finally:
        encoder.close()


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Row-wise cosine similarity."""
    return (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--folder", type=Path, required=True)
    parser.add_argument("--texts", type=Path, required=True)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--reference", action="store_true", help="also compare with sentence-transformers")
    args = parser.parse_args()
    texts = json.loads(args.texts.read_text())
    import onnxruntime

    print(f"onnxruntime {onnxruntime.__version__}, providers {onnxruntime.get_available_providers()}")
    if not torch.cuda.is_available():
        raise SystemExit("no CUDA GPU here: this benchmark compares the GPU with the CPU")
    print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}, {os.cpu_count()} CPU cores")
    cpu, cpu_s = timed_encode(args.folder, texts, "cpu", args.batch_size)
    gpu, gpu_s = timed_encode(args.folder, texts, "cuda", args.batch_size)
    c = cosines(cpu, gpu)
    print(f"{len(texts)} texts, batch {args.batch_size}: CPU {cpu_s:.2f} s ({len(texts) / cpu_s:.0f} texts/s), "
          f"CUDA {gpu_s:.2f} s ({len(texts) / gpu_s:.0f} texts/s), ratio CUDA/CPU {cpu_s / gpu_s:.1f}x")
    print(f"cosine CPU vs CUDA: min {c.min():.6f}, mean {c.mean():.6f}")
    if args.reference:
        try:
            from sentence_transformers import SentenceTransformer
        except ImportError:
            print("sentence-transformers is not installed: no reference")
            return
        model = SentenceTransformer(str(args.folder), device="cuda", model_kwargs={"dtype": torch.float32})
        ref = model.encode(texts, batch_size=args.batch_size, normalize_embeddings=True, convert_to_numpy=True)
        for name, ours in (("CPU", cpu), ("CUDA", gpu)):
            r = cosines(ours, ref)
            print(f"cosine {name} vs sentence-transformers: min {r.min():.6f}, mean {r.mean():.6f}")


if __name__ == "__main__":
    main()
