"""rlc's spec model: the single source of truth for fields, types, defaults and docs."""
