"""Generate the lab's tiny model repository, deterministically (same bytes on every machine).

Two commits of one repository: the first, then a second that changes the config and the last shard
(so a pinned revision can be told apart from ``main``). Files: ``config.json``, ``generation_config.json``,
``tokenizer.json``, ``tokenizer_config.json``, ``special_tokens_map.json``, three safetensors shards of
random float32 data with real safetensors headers, and ``model.safetensors.index.json``.
"""

from __future__ import annotations

import hashlib
import json
import random
import struct
from pathlib import Path

REPO_ID = "gpufleet-lab/tiny-model"
# The default lab's token (inventory/lab/group_vars): lab equipment, not a secret; tests make their own.
LAB_TOKEN = "hf_gpufleet_lab_not_a_secret"
SHARDS = 3
# Each shard holds two float32 tensors of ROWS x COLS: about 1.5 MiB per shard, except the last, which
# is LAST_ROWS high (about 12 MiB): larger than huggingface_hub's 10 MiB download chunk, so a connection
# dropped past the first chunk is resumed with a Range request (the tests show it).
ROWS = 384
LAST_ROWS = 3072
COLS = 512
HIDDEN = COLS
VOCAB = ["[PAD]", "[UNK]", "<s>", "</s>", "the", "capital", "of", "france", "is", "paris", "def", "is_prime"]


def _safetensors(tensors: dict[str, tuple[list[int], bytes]]) -> bytes:
    """A valid safetensors file: u64 header length, JSON header (8-byte aligned), then the raw data."""
    header: dict = {"__metadata__": {"format": "pt", "generator": "gpufleet-lab testhub"}}
    offset = 0
    blobs = []
    for name, (shape, data) in tensors.items():
        header[name] = {"dtype": "F32", "shape": shape, "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
        blobs.append(data)
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    return struct.pack("<Q", len(raw)) + raw + b"".join(blobs)


def _tokenizer() -> dict:
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [
            {
                "id": i,
                "content": t,
                "single_word": False,
                "lstrip": False,
                "rstrip": False,
                "normalized": False,
                "special": True,
            }
            for i, t in enumerate(VOCAB[:4])
        ],
        "normalizer": {"type": "Lowercase"},
        "pre_tokenizer": {"type": "Whitespace"},
        "post_processor": None,
        "decoder": None,
        "model": {"type": "WordLevel", "vocab": {t: i for i, t in enumerate(VOCAB)}, "unk_token": "[UNK]"},
    }


def files_for(generation: int) -> dict[str, bytes]:
    """The repository's files at commit number ``generation`` (1 or 2)."""
    files: dict[str, bytes] = {}
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": HIDDEN,
        "num_hidden_layers": SHARDS,
        "num_attention_heads": 8,
        "vocab_size": len(VOCAB),
        "torch_dtype": "float32",
        "_gpufleet_lab": f"generated test model, commit {generation}",
    }
    files["config.json"] = (json.dumps(config, indent=2) + "\n").encode()
    files["generation_config.json"] = (json.dumps({"bos_token_id": 2, "eos_token_id": 3}, indent=2) + "\n").encode()
    files["tokenizer.json"] = (json.dumps(_tokenizer(), indent=2) + "\n").encode()
    files["tokenizer_config.json"] = (
        json.dumps(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "bos_token": "<s>",
                "eos_token": "</s>",
                "unk_token": "[UNK]",
                "pad_token": "[PAD]",
                "model_max_length": 2048,
            },
            indent=2,
        )
        + "\n"
    ).encode()
    files["special_tokens_map.json"] = (
        json.dumps({"bos_token": "<s>", "eos_token": "</s>", "unk_token": "[UNK]", "pad_token": "[PAD]"}, indent=2)
        + "\n"
    ).encode()
    weight_map = {}
    total = 0
    for shard in range(1, SHARDS + 1):
        name = f"model-{shard:05d}-of-{SHARDS:05d}.safetensors"
        # The last shard changes in commit 2; the others stay byte-identical.
        seed = shard * 1000 + (generation if shard == SHARDS else 1)
        rnd = random.Random(seed)
        tensors = {}
        for part in ("self_attn.o_proj", "mlp.down_proj"):
            key = f"model.layers.{shard - 1}.{part}.weight"
            rows = LAST_ROWS if shard == SHARDS else ROWS
            tensors[key] = ([rows, COLS], rnd.randbytes(rows * COLS * 4))
            weight_map[key] = name
            total += rows * COLS * 4
        files[name] = _safetensors(tensors)
    files["model.safetensors.index.json"] = (
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2, sort_keys=True) + "\n"
    ).encode()
    return files


def commit_id(files: dict[str, bytes], parent: str | None) -> str:
    """A stable 40-hex commit id derived from the content (and the parent)."""
    h = hashlib.sha1(b"gpufleet-lab-commit\n")
    h.update((parent or "").encode())
    for name in sorted(files):
        h.update(name.encode() + b"\0" + hashlib.sha256(files[name]).digest())
    return h.hexdigest()


def generate(data_dir: Path) -> dict:
    """Write the repository's commits under ``data_dir`` and return the hub description (also hub.json).

    Layout: ``data_dir/repos/<ns>/<name>/<commit>/<files>`` and ``data_dir/hub.json``; rewriting is a no-op
    when the content is already there.
    """
    data_dir = Path(data_dir)
    commits = []
    parent = None
    for generation in (1, 2):
        files = files_for(generation)
        commit = commit_id(files, parent)
        target = data_dir / "repos" / REPO_ID / commit
        for name, content in files.items():
            path = target / name
            if not path.exists() or path.read_bytes() != content:
                path.parent.mkdir(parents=True, exist_ok=True)
                tmp = path.with_suffix(path.suffix + ".tmp")
                tmp.write_bytes(content)
                tmp.replace(path)
        commits.append(commit)
        parent = commit
    hub = {
        "repos": {
            REPO_ID: {
                "gated": "manual",
                "commits": commits,
                "refs": {"main": commits[-1], "v1": commits[0]},
                "lfs_suffixes": [".safetensors"],
            },
            # The same content, not gated: for tests that do not need a token.
            "gpufleet-lab/tiny-model-public": {
                "gated": False,
                "alias_of": REPO_ID,
                "commits": commits,
                "refs": {"main": commits[-1], "v1": commits[0]},
                "lfs_suffixes": [".safetensors"],
            },
        }
    }
    (data_dir / "hub.json").write_text(json.dumps(hub, indent=2) + "\n")
    return hub
