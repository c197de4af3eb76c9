"""Pure tensor math of RL post-training: advantage estimators, policy losses, KL estimators, loss reductions.

Every function takes tensors and plain numbers and returns tensors; nothing here knows about Ray,
models or configs, so the worker and driver decide what to feed in. Names follow spec v1
(`trainer.algorithm`), which follows SkyRL; each built-in is a card of the catalog (rlc.core.algorithms), and
`registry` finds a function by its spec name.
"""
