"""LAB EQUIPMENT: token log-probabilities of the simulated engine (docs/quality-gate.md, "The logprob comparison";
lab/sglang-sim/README.md, "Logprobs").

Real SGLang returns, for a chat completion with ``logprobs: true`` and ``top_logprobs: N``,
``choices[].logprobs.content[]``: per output token ``{token, bytes, logprob, top_logprobs: [{token, bytes,
logprob}]}`` (0.5.9 ``entrypoints/openai/protocol.py:93-102, 539``; 0.5.23 the same fields, ``protocol.py:377,
926``); with greedy decoding the logprobs are the raw log-softmax of the logits (``layers/sampler.py:35, 104-168``).
The simulator has no logits, so it makes them up, deterministically from the model, the prompt and the position:

* at each output position the emitted token (the simulator's text, unchanged) has the highest logit, 12-18, and
  19 other tokens of a small vocabulary trail it by 0.5-8; the rest of the vocabulary is one lump 9 below the top;
  ``logprob`` is the log-softmax over them;
* run-to-run noise: every logit gets Gaussian noise of standard deviation ``SGLANG_SIM_LOGPROB_JITTER`` (default
  0.002), drawn afresh for every request: two runs of the same version differ a little, as real SGLang does (its
  batching is not batch-invariant by default), so a comparison must tolerate that;
* the fault ``kernel-perturbation=SIZE`` multiplies every logit by (1 + SIZE * g), g a standard Gaussian fixed per
  model, prompt, position and token: a kernel whose results are off by about SIZE (0.01 = 1%) the same way every
  run. It does not change the text (a deliberate simplification: a perturbation big enough to flip the greedy
  token is also caught by the answers).
"""

from __future__ import annotations

import hashlib
import math
import os
import random

# tokens the alternatives are drawn from (the emitted token is never one of them at its own position)
VOCABULARY = (
    " the", " a", " an", " of", " to", " in", " is", " and", " that", " for", " it", " on", " with", " as", " was",
    " at", " by", " be", " this", " are", " from", " or", " one", " two", " 1", " 2", " 3", " 0", ".", ",", ":", "!",
    "?", "-", "(", ")", "\n", "The", "A", "It", "In", "Yes", "No", '"', "'", " I", " We", " You", " they", " not",
)  # fmt: skip
JITTER_ENV = "SGLANG_SIM_LOGPROB_JITTER"
DEFAULT_JITTER = 0.002
ALTERNATIVES = 19
TAIL_GAP = 9.0


def jitter() -> float:
    try:
        return max(0.0, float(os.environ.get(JITTER_ENV, DEFAULT_JITTER)))
    except ValueError:
        return DEFAULT_JITTER


def _rng(*parts: str) -> random.Random:
    return random.Random(hashlib.sha256("\0".join(parts).encode("utf-8", "replace")).digest())


def _entry(token: str, logprob: float) -> dict:
    return {"token": token, "bytes": list(token.encode("utf-8")), "logprob": logprob}


def position(model: str, prompt: str, index: int, token: str, top_n: int, perturbation: float, noise) -> dict:
    """One output token's ``{token, bytes, logprob, top_logprobs}`` as SGLang's chat completion gives it."""
    rng = _rng(model, prompt, str(index))
    top = 12.0 + 6.0 * rng.random()
    others = [t for t in VOCABULARY if t != token]
    alternatives = rng.sample(others, ALTERNATIVES)
    logits = {token: top}
    for alt in alternatives:
        logits[alt] = top - 0.5 - 7.5 * rng.random()
    if perturbation:
        prng = _rng("kernel-perturbation", model, prompt, str(index))
        logits = {t: v * (1.0 + perturbation * prng.gauss(0.0, 1.0)) for t, v in logits.items()}
    if noise is not None:
        scale = jitter()
        logits = {t: v + scale * noise.gauss(0.0, 1.0) for t, v in logits.items()}
    tail = top - TAIL_GAP
    peak = max([*logits.values(), tail])
    lse = peak + math.log(sum(math.exp(v - peak) for v in logits.values()) + math.exp(tail - peak))
    logprobs = {t: round(v - lse, 6) for t, v in logits.items()}
    ranked = sorted(logprobs.items(), key=lambda kv: -kv[1])[: max(0, top_n)]
    return {**_entry(token, logprobs[token]), "top_logprobs": [_entry(t, lp) for t, lp in ranked]}


def content(model: str, prompt: str, pieces: list[str], top_n: int, perturbation: float) -> list[dict]:
    """``choices[].logprobs.content`` for the output ``pieces`` (fresh run-to-run noise for this request)."""
    noise = random.Random()
    return [position(model, prompt, i, piece, top_n, perturbation, noise) for i, piece in enumerate(pieces)]
