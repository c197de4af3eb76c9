"""The bottom layer both sides of a compiled job share: diagnostics, overrides, the content hash, the plan and
the job types. It imports nothing else of rlc, so neither `rlc.spec` nor `rlc.runtime` needs the compiler."""
