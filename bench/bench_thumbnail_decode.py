"""Thumbnail decoding of large image files: Pillow's full decode (what the renderer did) against the bounded decode
of ``engine.data.image_decode`` (a JPEG drafted to 1/2..1/8 scale, a PNG over the pixel budget refused from its
header), both followed by the same 64 px square. Prints seconds and peak-memory growth of each, measured in a child
process each, and their ratios.

    python bench/bench_thumbnail_decode.py               # a 64-megapixel JPEG and PNG (about 30 CPU-seconds)
    python bench/bench_thumbnail_decode.py --side 12000  # the issue's 144-megapixel PNG (the baseline takes minutes)
"""
from __future__ import annotations

import argparse
import importlib.util
import sys
import tempfile
from pathlib import Path



def _from_tests(name: str):
    """A module of tests/ loaded from its file (tests/ is no package; no sys.path edit)."""
    spec = importlib.util.spec_from_file_location(name, Path(__file__).resolve().parents[1] / "tests" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # the test module imports peak_memory by name
    spec.loader.exec_module(module)
    return module


measure = _from_tests("peak_memory").measure  # the tests' child-process meter
constant_png = _from_tests("test_thumbnail_bounds").constant_png

SETUP = """
import time
import numpy as np
from PIL import Image
from engine.data.image_decode import decode_rgb
from engine.data.thumbnails import MAX_THUMB_SIZE, square

def baseline(path):
    t = time.perf_counter()
    with Image.open(path) as image:
        square(np.asarray(image.convert("RGB")))
    return time.perf_counter() - t

def bounded(path):
    t = time.perf_counter()
    try:
        square(np.asarray(decode_rgb(path, min_side=MAX_THUMB_SIZE, always_draft=True)))
    except ValueError:
        pass  # refused: the renderer shows no image
    return time.perf_counter() - t
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--side", type=int, default=8000, help="image side in pixels (default 8000: 64 megapixels)")
    args = parser.parse_args()
    from PIL import Image

    with tempfile.TemporaryDirectory() as folder:
        jpeg, png = Path(folder) / "big.jpg", Path(folder) / "big.png"
        Image.linear_gradient("L").resize((args.side, args.side)).save(jpeg, quality=80)
        constant_png(png, args.side, args.side)
        print(f"{args.side}x{args.side} pixels: JPEG {jpeg.stat().st_size / 1e6:.2f} MB, PNG {png.stat().st_size / 1e6:.2f} MB")
        for path in (jpeg, png):
            old = measure(SETUP, f"baseline({str(path)!r})", headroom=8_000_000_000)
            new = measure(SETUP, f"bounded({str(path)!r})", headroom=8_000_000_000)
            print(f"{path.suffix[1:]:>4}: Pillow full decode {old['result']:.2f} s, +{old['grew'] / 1e6:.0f} MB; bounded "
                  f"{new['result']:.3f} s, +{new['grew'] / 1e6:.0f} MB; time ratio {old['result'] / new['result']:.0f}x, "
                  f"memory ratio {max(old['grew'], 1) / max(new['grew'], 1):.0f}x")


if __name__ == "__main__":
    main()
