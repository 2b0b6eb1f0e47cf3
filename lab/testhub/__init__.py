"""gpufleet lab test hub: a small generated model and a local server for the Hugging Face hub API subset
that ``huggingface_hub`` uses (lab equipment; it never talks to the real hub).

- ``testhub.model``: generates a tiny model repository (config, tokenizer files, safetensors shards of
  random data and their index) at two commits, deterministically.
- ``testhub.server``: serves it like the hub: ``/api/models/{repo}/revision/{rev}`` (``?blobs=true``),
  ``/api/models/{repo}/tree/{rev}``, ``HEAD``/``GET /{repo}/resolve/{rev}/{file}`` (ETag, X-Repo-Commit,
  X-Linked-Etag/X-Linked-Size for LFS files, Range), Bearer token checks, gated refusals, and faults
  for tests (drop a connection mid-file once, throttle); also a plain HTTP mirror with a manifest.

Run: ``python -m testhub serve --bind 10.123.0.1 --port 8490 --state-dir DIR`` (see ``--help``).
"""
