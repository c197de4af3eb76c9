"""SkyRL's formats: its legacy YAML with its whole history (`legacy`, `history`, the tables read only for legacy
input), the importer of such a file (`importer`) and its `main_base` launch scripts (`script`)."""
