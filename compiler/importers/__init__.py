"""Importers of foreign config formats: SkyRL's legacy YAML (its whole history) and AReaL's experiment configs."""
