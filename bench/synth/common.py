"""What every synthetic trace kind shares: seeding, token-level responses, latencies."""

from __future__ import annotations

import hashlib
import math
import random
from dataclasses import dataclass

from faker import Faker

from bench.tokenizer import ByteBPETokenizer
from bench.trace import Latency, Response

SYNTH_MODEL = "rollout-bench/synthetic"


def group_seed(seed: int, kind: str, group_index: int) -> int:
    """Independent seed per group: trajectory k is the same whatever n is."""
    digest = hashlib.sha256(f"{kind}:{seed}:{group_index}".encode()).digest()
    return int.from_bytes(digest[:8], "big")


@dataclass
class GroupRandom:
    """The random sources of one group: a plain RNG for numbers, faker for text."""

    rng: random.Random
    fake: Faker

    @classmethod
    def for_group(cls, fake: Faker, seed: int, kind: str, group_index: int) -> "GroupRandom":
        value = group_seed(seed, kind, group_index)
        fake.seed_instance(value)
        return cls(random.Random(value), fake)

    def lognormal_int(self, median: float, sigma: float, low: int, high: int) -> int:
        return max(low, min(high, round(self.rng.lognormvariate(math.log(median), sigma))))


def sample_logprobs(rng: random.Random, count: int) -> list[float]:
    """Per-token logprobs of a sampled continuation: mostly near 0, a long negative tail."""
    values = []
    for _ in range(count):
        magnitude = min(20.0, max(1e-4, rng.lognormvariate(-2.5, 1.8)))
        values.append(-round(magnitude, 4))
    return values


def sample_latency(rng: random.Random, tokens: int, prompt_tokens: int, *, tail: float) -> Latency:
    """Time to first token grows with the prompt; a `tail` share of requests straggle."""
    ttft = rng.lognormvariate(math.log(0.04 + prompt_tokens * 2e-5), 0.4)
    per_token = rng.lognormvariate(math.log(0.02), 0.3)
    decode = tokens * per_token
    if rng.random() < tail:
        decode *= rng.uniform(10, 50)
    return Latency(ttft=round(ttft, 4), total=round(ttft + decode, 4))


def completion(
    tokenizer: ByteBPETokenizer,
    rng: random.Random,
    text: str,
    *,
    max_new_tokens: int,
    prompt_tokens: int,
    cached_tokens: int,
    weight_version: str,
    tail: float,
) -> Response:
    """The server's answer when the model writes `text` then EOS, cut at `max_new_tokens`.

    Ids always decode to the text: on a cut the text is re-derived from the kept ids.
    """
    ids = tokenizer.encode(text) + [tokenizer.eos_token_id]
    if len(ids) > max_new_tokens:
        ids = ids[:max_new_tokens]
        finish: dict[str, object] = {"type": "length", "length": max_new_tokens}
        text = tokenizer.decode(ids)
    else:
        finish = {"type": "stop", "matched": tokenizer.eos_token_id}
    return Response(
        output_ids=ids,
        logprobs=sample_logprobs(rng, len(ids)),
        text=text,
        finish_reason=finish,
        weight_version=weight_version,
        prompt_tokens=prompt_tokens,
        completion_tokens=len(ids),
        cached_tokens=cached_tokens,
        latency=sample_latency(rng, len(ids), prompt_tokens, tail=tail),
    )


def sentences_of_about(group: GroupRandom, tokenizer: ByteBPETokenizer, tokens: int) -> str:
    """Prose of roughly `tokens` tokens."""
    parts: list[str] = []
    count = 0
    while count < tokens:
        sentence = group.fake.sentence(nb_words=group.rng.randint(6, 18))
        parts.append(sentence)
        count += len(tokenizer.encode(" " + sentence))
    return " ".join(parts)


def sampling_params(max_new_tokens: int, eos_token_id: int) -> dict[str, object]:
    """Sampling parameters as slime and miles send them to SGLang."""
    return {
        "temperature": 1.0,
        "top_p": 1.0,
        "top_k": -1,
        "max_new_tokens": max_new_tokens,
        "stop_token_ids": [eos_token_id],
        "skip_special_tokens": False,
        "no_stop_trim": True,
        "spaces_between_special_tokens": False,
    }
