#!/usr/bin/python3
"""Stand-in for a server loading --model: reads config, index and every shard's safetensors header offline."""

import argparse
import json
import struct
import sys
from pathlib import Path

parser = argparse.ArgumentParser()
parser.add_argument("--model", required=True)
parser.add_argument("--served-model-name", required=True)
args = parser.parse_args()
model = Path(args.model)
if not model.is_dir():
    sys.exit(f"--model {model} is not a local directory")
config = json.loads((model / "config.json").read_text())
index = json.loads((model / "model.safetensors.index.json").read_text())
tensors = 0
for shard in sorted(set(index["weight_map"].values())):
    with (model / shard).open("rb") as fh:
        (length,) = struct.unpack("<Q", fh.read(8))
        header = json.loads(fh.read(length))
    tensors += len([k for k in header if k != "__metadata__"])
if tensors != len(index["weight_map"]):
    sys.exit(f"shards hold {tensors} tensors, the index lists {len(index['weight_map'])}")
print(f"model OK: {args.served_model_name} from {model} ({config['model_type']}, {tensors} tensors)")
