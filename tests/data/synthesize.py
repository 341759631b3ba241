"""Writes the two synthetic trace excerpts beside it, in the exact published formats of traces whose
real files are not shipped here (tests/data/README.md):

- `mooncake_500.jsonl`: Mooncake's FAST'25 trace format, one JSON object a line: `timestamp` (ms
  since the trace's start), `input_length`, `output_length`, `hash_ids` (one id per 512-token
  block; new ids count up from the last one used, shared ids mean a shared prefix). Requests pick
  one of a few long shared prefixes (system prompts, documents) and, one in three, continue an
  earlier request's conversation (its ids, then new ones), as the published trace's ids show.
- `burstgpt_500.csv`: BurstGPT's columns `Timestamp,Model,Request tokens,Response tokens,Total
  tokens,Log Type`; bursty arrivals (gamma gaps of shape 0.3), ChatGPT and GPT-4 rows,
  conversation and API logs, and a few failed requests (0 response tokens), as the published
  trace has.

Sizes are smaller than the real traces' (prompts of 0.5-4k tokens rather than Mooncake's 7.6k
mean) so a functional test replays 500 requests in seconds. Seeded: running it again writes the
same files.

    .venv/bin/python tests/data/synthesize.py
"""

from __future__ import annotations

import json
import random
from pathlib import Path

HERE = Path(__file__).resolve().parent
BLOCK = 512


def mooncake(n: int = 500, seed: int = 35) -> list[dict[str, object]]:
    rng = random.Random(seed)
    next_id = 0

    def fresh(k: int) -> list[int]:
        nonlocal next_id
        ids = list(range(next_id, next_id + k))
        next_id += k
        return ids

    roots = [fresh(rng.randint(1, 4)) for _ in range(6)]
    weights = [1.0 / (i + 1) for i in range(len(roots))]
    earlier: list[list[int]] = []
    t_ms, out = 0.0, []
    for _ in range(n):
        t_ms += rng.expovariate(1.0 / 150.0)  # about 6.7 requests a second
        if earlier and rng.random() < 1 / 3:
            ids = list(rng.choice(earlier[-50:])) + fresh(rng.randint(1, 2))
        else:
            ids = list(rng.choices(roots, weights)[0]) + fresh(rng.randint(0, 2))
        ids = ids[:8]
        earlier.append(ids)
        length = len(ids) * BLOCK - rng.randint(0, BLOCK - 1)
        out.append({"timestamp": int(t_ms), "input_length": length, "output_length": rng.randint(8, 120),
                    "hash_ids": ids})
    return out


def burstgpt(n: int = 500, seed: int = 35) -> list[list[object]]:
    rng = random.Random(seed)
    t, rows = 0.0, []
    for _ in range(n):
        t += rng.gammavariate(0.3, 1.0 / (0.3 * 4.0))  # mean 4 a second, bursty
        model = "GPT-4" if rng.random() < 0.25 else "ChatGPT"
        log = "API log" if rng.random() < 0.4 else "Conversation log"
        request = max(1, int(rng.lognormvariate(5.5, 0.9)))
        response = 0 if rng.random() < 0.02 else max(1, int(rng.lognormvariate(4.5, 0.7)))
        rows.append([round(t), model, min(request, 6000), min(response, 400), min(request, 6000) + min(response, 400),
                     log])
    return rows


def main() -> None:
    with open(HERE / "mooncake_500.jsonl", "w") as f:
        for line in mooncake():
            f.write(json.dumps(line) + "\n")
    with open(HERE / "burstgpt_500.csv", "w") as f:
        f.write("Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n")
        for row in burstgpt():
            f.write(",".join(str(c) for c in row) + "\n")


if __name__ == "__main__":
    main()
