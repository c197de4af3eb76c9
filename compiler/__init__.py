"""The compiler: load, migrate, validate, resolve, check (later plan, emit, diff) and the CLI."""
