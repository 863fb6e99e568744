"""``python -m engine export-images``: one split of a dataset as PNG class folders (:mod:`engine.data.export_images`)."""
from __future__ import annotations

import argparse
from pathlib import Path

from engine.data.export_images import export_images


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The options of ``export-images``."""
    p.add_argument("--dataset", required=True, help="a dataset name (see the README), e.g. fashion")
    p.add_argument("--split", choices=("train", "test"), default="test")
    p.add_argument("--out", required=True, type=Path, metavar="DIR", help="folder to create (absent or empty)")
    p.add_argument("--max-per-class", type=int, metavar="N", help="the first N images of each class (default: all)")
    p.add_argument("--root", default="data", help="the dataset's root folder (default: data)")


def cmd_export_images(args: argparse.Namespace) -> int:
    """The ``export-images`` command: write the tree and print one line per class folder."""
    counts = export_images(args.dataset, args.out, split=args.split, max_per_class=args.max_per_class, root=args.root)
    for folder, n in sorted(counts.items()):
        print(f"{n:6d}  {args.out / folder}")
    print(f"wrote {sum(counts.values())} images of {args.dataset} ({args.split}) to {args.out}")
    return 0
