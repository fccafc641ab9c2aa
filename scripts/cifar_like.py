"""CIFAR-10-shaped data in CIFAR-10's binary format, for runs where the real set is not at hand.

    python3 scripts/cifar_like.py DIR [--train 5000] [--test 1000] [--seed 0]

Writes DIR/data_batch_1.bin … data_batch_5.bin and DIR/test_batch.bin (records of one label
byte and 3 072 pixel bytes, channel by channel, row by row), which `--data cifar10:DIR` reads.
Each class has a fixed random smooth pattern, and an image is its class's pattern plus pixel
noise, so that a network learns the classes in a few hundred iterations and an attack has
correctly classified images to work on (random labels would leave it almost none). The numbers
measured on it are speeds and memory, not robustness: the set has the shape of CIFAR-10, not
its content. Standard library only; the same seed writes the same bytes.
"""

import argparse
import os
import random
import sys

CLASSES, CHANNELS, SIDE = 10, 3, 32
CELL = 8  # the patterns are constant on 8×8 blocks: smooth enough to learn quickly


def patterns(rng):
    """One pattern per class: a grey level per 8×8 block and channel, in [0.2, 0.8]."""
    blocks = SIDE // CELL
    out = []
    for _ in range(CLASSES):
        grid = [[[rng.uniform(0.2, 0.8) for _ in range(blocks)] for _ in range(blocks)]
                for _ in range(CHANNELS)]
        out.append(grid)
    return out


def record(rng, label, pattern):
    pixels = bytearray([label])
    for c in range(CHANNELS):
        for y in range(SIDE):
            row = pattern[c][y // CELL]
            for x in range(SIDE):
                v = row[x // CELL] + rng.gauss(0.0, 0.12)
                pixels.append(min(255, max(0, round(v * 255))))
    return bytes(pixels)


def write(path, n, rng, pats):
    with open(path, "wb") as f:
        for i in range(n):
            label = i % CLASSES
            f.write(record(rng, label, pats[label]))


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("dir")
    p.add_argument("--train", type=int, default=5000, help="training images, over 5 batches")
    p.add_argument("--test", type=int, default=1000, help="test images")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    if a.train < 5 or a.test < 1:
        sys.exit("--train: expected at least 5 (one per batch file); --test: at least 1")
    rng = random.Random(a.seed)
    pats = patterns(rng)
    os.makedirs(a.dir, exist_ok=True)
    per_batch = a.train // 5
    for b in range(1, 6):
        write(os.path.join(a.dir, f"data_batch_{b}.bin"), per_batch, rng, pats)
    write(os.path.join(a.dir, "test_batch.bin"), a.test, rng, pats)
    print(f"{a.dir}: {5 * per_batch} training and {a.test} test images, seed {a.seed}")


if __name__ == "__main__":
    main()
