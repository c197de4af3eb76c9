"""`rlc lsp`: every finding, hover and fix of the compiler in the editor, as a language server."""
