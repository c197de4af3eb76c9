"""verl's jobs: composed as verl composes them (`compose` on the vendored `defaults/`, `hydra_overrides`), mapped to
spec v1 (`mapping`, `record`, `importer`), and its `main_ppo` launch scripts (`script`)."""
