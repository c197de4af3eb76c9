"""AReaL's experiment configs: the importer (`importer`), one file being imported (`record`), and its mapping
section by section (`sections`, `algorithm`)."""
