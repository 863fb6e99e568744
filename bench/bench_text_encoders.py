"""Text encoders' throughput: WordNet definitions embedded by each offline MiniLM model, texts/s and the ratio to
paraphrase-MiniLM-L3-v2 (ONNX) measured in the same run, so a loaded machine slows every model alike.

    python bench/bench_text_encoders.py                    # 1,000 definitions, every core, batch 64
    python bench/bench_text_encoders.py --texts 4000 --threads 1 --device cuda
"""
from __future__ import annotations

import argparse
import time

import torch

from engine.core.threads import available_cores
from engine.data.wordnet import wordnet_task
from engine.models.text_models import TEXT_SEQUENCE, load_text_model


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--texts", type=int, default=1000)
    p.add_argument("--threads", type=int, default=available_cores())
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--device", default="cpu", help="cpu, or cuda (the torch BERT on the GPU; ONNX on CUDA when "
                                                   "onnxruntime has its provider)")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    texts = wordnet_task(queries=1, gallery=args.texts, seed=0).gallery_texts
    print(f"{len(texts)} WordNet definitions, {args.threads} thread(s), batch {args.batch_size}, device {args.device}")
    rates = {}
    for name in TEXT_SEQUENCE:
        started = time.perf_counter()
        model = load_text_model(name, threads=args.threads, device=args.device)
        loaded = time.perf_counter()
        model.encode(texts, batch_size=args.batch_size)
        if args.device.startswith("cuda"):
            torch.cuda.synchronize()
        done = time.perf_counter()
        rates[name] = len(texts) / (done - loaded)
        print(f"{name:16s} load {loaded - started:5.1f} s  embed {done - loaded:6.1f} s  {rates[name]:7.1f} texts/s  "
              f"x{rates[name] / rates[TEXT_SEQUENCE[0]]:.2f} of {TEXT_SEQUENCE[0]}")


if __name__ == "__main__":
    main()
