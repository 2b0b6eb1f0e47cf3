import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
for sub in ("roles/ml_env/files",):
    path = str(REPO / sub)
    if path not in sys.path:
        sys.path.insert(0, path)
