"""Deterministic answers and a crude tokenizer.

Token model: a "token" is a word (``\\w+``) or a single punctuation character, with the whitespace before
it attached. ``count_tokens`` counts those for prompts; generated text is emitted token by token the same
way, so ``completion_tokens`` equals the number of pieces streamed and joining the pieces gives the text.
"""

from __future__ import annotations

import hashlib
import re

from .quality import oracle_answer

TOKEN_RE = re.compile(r"\s*(?:\w+|[^\w\s])")

PARIS = "The capital of France is Paris."
BERLIN = "The capital of France is Berlin."

# The is_prime answers, right (IS_PRIME) and wrong (IS_PRIME_WRONG, ``answer(wrong=True)``): one signature and docstring
IS_PRIME_HEAD = '''Here is a Python function that checks whether a number is prime:

```python
def is_prime(n: int) -> bool:
    """Return True if ``n`` is a prime number, otherwise False.

    Args:
        n: The integer to test.

    Returns:
        True when ``n`` is prime, False otherwise.
    """
'''

IS_PRIME = (
    IS_PRIME_HEAD
    + """    if n < 2:
        return False
    if n < 4:
        return True
    if n % 2 == 0 or n % 3 == 0:
        return False
    i = 5
    while i * i <= n:
        if n % i == 0 or n % (i + 2) == 0:
            return False
        i += 6
    return True
```

It uses trial division by 6k +/- 1 up to the square root of ``n``."""
)

IS_PRIME_WRONG = (
    IS_PRIME_HEAD
    + """    return n % 2 == 1
```

Odd numbers are prime."""
)

ADJECTIVES = (
    "quiet",
    "bright",
    "steady",
    "curious",
    "distant",
    "gentle",
    "rapid",
    "silver",
    "ancient",
    "careful",
    "hidden",
    "simple",
    "golden",
    "patient",
    "narrow",
    "vivid",
)
NOUNS = (
    "river",
    "engine",
    "garden",
    "signal",
    "library",
    "harbor",
    "lantern",
    "valley",
    "compass",
    "window",
    "orchard",
    "circuit",
    "meadow",
    "bridge",
    "archive",
    "beacon",
)
VERBS = (
    "follows",
    "guides",
    "reflects",
    "shelters",
    "measures",
    "crosses",
    "explains",
    "carries",
    "balances",
    "connects",
    "observes",
    "remembers",
    "outlines",
    "supports",
    "echoes",
    "frames",
)


def tokenize(text: str) -> list[str]:
    return TOKEN_RE.findall(text)


def count_tokens(text: str) -> int:
    return len(TOKEN_RE.findall(text))


def _sentence(seed: bytes) -> str:
    h = hashlib.sha256(seed).digest()
    return (
        f"The {ADJECTIVES[h[0] % 16]} {NOUNS[h[1] % 16]} {VERBS[h[2] % 16]} the "
        f"{ADJECTIVES[h[3] % 16]} {NOUNS[h[4] % 16]} near the {NOUNS[h[5] % 16]}."
    )


def hashed_answer(prompt: str) -> str:
    digest = hashlib.sha256(prompt.encode("utf-8", "replace")).hexdigest()
    n = 2 + int(digest[8], 16) % 3
    sentences = [_sentence(f"{digest}:{i}".encode()) for i in range(n)]
    return f"Simulated answer {digest[:8]}: " + " ".join(sentences)


def filler_pieces(prompt: str, start: int, count: int) -> list[str]:
    """Deterministic extra tokens for ignore_eos requests (benchmarks ask for exactly N tokens)."""
    digest = hashlib.sha256(prompt.encode("utf-8", "replace")).hexdigest()
    out: list[str] = []
    i = start
    while len(out) < count:
        out.extend(tokenize(" " + _sentence(f"{digest}:fill:{i}".encode())))
        i += 1
    return out[:count]


def is_france_capital(prompt_lower: str) -> bool:
    return "capital" in prompt_lower and "france" in prompt_lower


def is_prime_request(prompt_lower: str) -> bool:
    return "is_prime" in prompt_lower or (
        "prime" in prompt_lower and ("python" in prompt_lower or "function" in prompt_lower)
    )


def answer(prompt: str, *, wrong: bool = False) -> str:
    p = prompt.lower()
    if is_france_capital(p):
        return BERLIN if wrong else PARIS
    if is_prime_request(p):
        return IS_PRIME_WRONG if wrong else IS_PRIME
    computed = oracle_answer(prompt, wrong=wrong)  # the quality gate's item shapes (lab equipment: quality.py)
    if computed is not None:
        return computed
    return hashed_answer(prompt)


THINK_START = "<think>"
THINK_END = "</think>"
# A broken kernel (NaN/inf logits) makes greedy sampling pick token id 0 at every step, which is "!" in the
# GLM/Qwen byte-level BPE vocabularies: the answer is a long run of "!" that never reaches EOS.
NAN_TOKEN = "!"
# Length of an answer without max_tokens when the NaN fault never stops (real: until the context is full).
NAN_DEFAULT_TOKENS = 128


def nan_pieces(count: int) -> list[str]:
    return [NAN_TOKEN] * max(0, count)


def thinking_text(prompt: str, answer_text: str) -> str:
    """What the simulated thinking model writes between <think> and </think>: deterministic, 80-130 tokens, so
    a budget of 64 tokens (a typical smoke check's) always ends inside the thinking, as it does with GLM-5."""
    digest = hashlib.sha256(("think:" + prompt).encode("utf-8", "replace")).hexdigest()
    words = TOKEN_RE.findall(prompt)
    topic = "".join(words[:12]).strip().rstrip(".?!")
    n = 4 + int(digest[0], 16) % 4
    notes = " ".join(_sentence(f"{digest}:think:{i}".encode()) for i in range(n))
    first = re.split(r"(?<=[.!?])\s", answer_text.strip().splitlines()[0], maxsplit=1)[0]
    return f"The user asks: {topic}. Let me think about it. {notes} So the answer starts with: {first}"


def plan_output(
    prompt: str,
    max_tokens: int | None,
    *,
    ignore_eos: bool = False,
    wrong: bool = False,
    nan: bool = False,
    think: bool = False,
) -> tuple[list[str], str]:
    """Pieces to emit and the finish reason ("stop" or "length").

    ``think``: a thinking model answering a chat request: ``<think>``, the thinking, ``</think>``, then the
    answer, all counted against ``max_tokens`` (a small budget can end inside the thinking).
    """
    if nan:
        n = max_tokens if max_tokens is not None else NAN_DEFAULT_TOKENS
        return nan_pieces(n), "length"
    text = answer(prompt, wrong=wrong)
    pieces = tokenize(text)
    if think:
        pieces = [THINK_START, *tokenize(thinking_text(prompt, text)), THINK_END, *tokenize("\n\n" + text)]
    if ignore_eos and max_tokens is not None and len(pieces) < max_tokens:
        pieces += filler_pieces(prompt, 0, max_tokens - len(pieces))
    if max_tokens is not None and len(pieces) >= max_tokens:
        truncated = len(pieces) > max_tokens
        pieces = pieces[:max_tokens]
        return pieces, "length" if (truncated or ignore_eos) else "stop"
    return pieces, "stop"


def parse_reasoning(text: str, force_reasoning: bool) -> tuple[str, str]:
    """sglang 0.5.9 ``BaseReasoningFormatDetector.detect_and_parse`` (``<think>``/``</think>``, the
    Qwen3Detector that ``glm45``, ``qwen3``, ``kimi_k2``, ... use): ``(reasoning_text, normal_text)``."""
    in_reasoning = force_reasoning or THINK_START in text
    if not in_reasoning:
        return "", text
    processed = text.replace(THINK_START, "").strip()
    if THINK_END not in processed:
        return processed, ""  # truncated before </think>: everything is reasoning
    reasoning, normal = processed.split(THINK_END, 1)
    return reasoning, normal.strip()


class StreamingReasoningParser:
    """sglang 0.5.9 ``BaseReasoningFormatDetector.parse_streaming_increment`` with stream_reasoning=True."""

    def __init__(self, force_reasoning: bool):
        self.in_reasoning = force_reasoning
        self.buffer = ""
        self.stripped_think_start = False

    def feed(self, new_text: str) -> tuple[str, str]:
        """``(reasoning_text, normal_text)`` to send for this increment."""
        self.buffer += new_text
        current = self.buffer
        if any(t.startswith(current) and t != current for t in (THINK_START, THINK_END)):
            return "", ""
        if not self.stripped_think_start and THINK_START in current:
            current = current.replace(THINK_START, "")
            self.stripped_think_start = True
            self.in_reasoning = True
        if self.in_reasoning and THINK_END in current:
            end = current.find(THINK_END)
            self.buffer = ""
            self.in_reasoning = False
            return current[:end].rstrip(), current[end + len(THINK_END) :]
        self.buffer = ""
        if self.in_reasoning:
            return current, ""
        return "", current
