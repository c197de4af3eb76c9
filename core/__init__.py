"""The bottom layer both sides of a compiled job share: diagnostics, overrides, the content hash, the plan, the job
types, the built-in environments, the runtime's facts the compiler needs, and the dataclass decorator rlc's light
packages declare their classes with. It imports nothing of the compiler or the runtime (the job types name the spec's
own), so neither `rlc.spec` nor `rlc.runtime` needs the compiler."""
