"""The content hash of a resolved spec: what ties resolved.yaml, plan.json and a checkpoint to one compile."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from rlc.core.plain import plain_dataclass


def content_hash(spec: Any) -> str:
    """sha256 of the resolved values: comments, key order and written-out defaults do not change it."""
    canonical = json.dumps(plain_dataclass(spec), sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return "sha256:" + hashlib.sha256(canonical.encode()).hexdigest()
