"""Semantic rules, one module per concern (each rule has a code, a title and the keys it reads)."""
