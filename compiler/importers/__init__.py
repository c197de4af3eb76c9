"""Importers of foreign config formats, each of the one shape of rlc.compiler.importers.base.Importer; the list of
them is rlc.compiler.importers.registry.IMPORTERS."""
