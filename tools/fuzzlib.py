"""Frame mutations for fuzzing the ingest (tools/fuzz_service.py and the robustness tests).

A mutated frame is a valid one with a few bytes flipped, cut out or inserted:
it exercises every path of the decoder and validator (truncation, wrong
types, bad lengths, trailing bytes, NaN patterns) far more often than random
bytes, which mostly fail at the first byte.
"""

from __future__ import annotations

import random


def mutate(frame: bytes, rng: random.Random, *, max_ops: int = 6, max_span: int = 8) -> bytes:
    b = bytearray(frame)
    for _ in range(rng.randint(1, max_ops)):
        op, pos = rng.random(), rng.randrange(max(len(b), 1))
        if op < 0.5 and b:
            b[pos] = rng.randrange(256)
        elif op < 0.75:
            del b[pos:pos + rng.randint(1, max_span)]
        else:
            b[pos:pos] = rng.randbytes(rng.randint(1, max_span))
    return bytes(b)
