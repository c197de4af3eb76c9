"""Jinja2 templates of the emitted artifacts (package data)."""
