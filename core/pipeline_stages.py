"""Where Megatron-Core puts a model's decoder layers over pipeline stages (uneven first and last stages, virtual
stages), written once for both sides: the compiler's rules and memory estimate read it, the runtime's Megatron worker
loads and names its weights by it."""

from __future__ import annotations

from dataclasses import dataclass

# TransformerConfig's arguments (SkyRL's megatron_config.transformer_config_kwargs) that place the layers.
FIRST, LAST, VIRTUAL = (
    "num_layers_in_first_pipeline_stage",
    "num_layers_in_last_pipeline_stage",
    "virtual_pipeline_model_parallel_size",
)


@dataclass(frozen=True)
class Stages:
    """Where Megatron-Core puts the decoder layers: `first` / `last` layers on the first / last pipeline stage when
    set, the rest split evenly over the other stages; each stage's layers cut into `virtual` chunks, and chunk v of
    every stage comes before chunk v + 1 of any (the interleaved schedule's order)."""

    num_layers: int
    pp: int = 1
    first: int | None = None
    last: int | None = None
    virtual: int = 1

    @classmethod
    def of(cls, num_layers: int, pp: int, settings: dict | None) -> Stages:
        """The stages `settings` (TransformerConfig's arguments) ask for."""
        s = settings or {}
        return cls(
            num_layers,
            pp,
            s.get(FIRST),
            s.get(LAST),
            s.get(VIRTUAL) or 1,
        )

    def per_stage(self) -> list[int]:
        """Decoder layers on each pipeline stage."""
        ends = [n for n in (self.first, self.last) if n is not None]
        if any(n <= 0 for n in ends) or self.virtual < 1:
            raise ValueError(f"first {self.first}, last {self.last} and virtual {self.virtual} must be positive")
        middle_stages, middle = self.pp - len(ends), self.num_layers - sum(ends)
        if middle_stages < 0 or middle < 0 or (middle_stages == 0) != (middle == 0) or middle % max(middle_stages, 1):
            if not ends:
                raise ValueError(f"{self.num_layers} layers do not divide evenly over {self.pp} pipeline stages")
            raise ValueError(
                f"{self.num_layers} layers do not split over {self.pp} pipeline stages (first {self.first}, "
                f"last {self.last}): the {middle} layers left for the other {middle_stages} stages do not divide evenly"
            )
        sizes = [middle // max(middle_stages, 1)] * self.pp
        if self.first is not None:
            sizes[0] = self.first
        if self.last is not None:
            sizes[-1] = self.last
        if any(n % self.virtual for n in sizes):
            raise ValueError(f"stages of {sizes} layers do not divide into {self.virtual} virtual stages")
        return sizes

    def layers(self, pp_rank: int, vp_stage: int = 0) -> range:
        """Global indices of the layers of virtual stage `vp_stage` on pipeline stage `pp_rank`."""
        if not (0 <= pp_rank < self.pp and 0 <= vp_stage < self.virtual):
            raise ValueError(f"no stage ({pp_rank}, {vp_stage}) among {self.pp} x {self.virtual}")
        chunks = [n // self.virtual for n in self.per_stage()]
        start = vp_stage * sum(chunks) + sum(chunks[:pp_rank])
        return range(start, start + chunks[pp_rank])

    def holds_embedding(self, pp_rank: int, vp_stage: int = 0) -> bool:
        return pp_rank == 0 and vp_stage == 0

    def holds_head(self, pp_rank: int, vp_stage: int = 0) -> bool:
        return pp_rank == self.pp - 1 and vp_stage == self.virtual - 1


def balanced(num_layers: int, pp: int) -> Stages:
    """The even split where the layers divide, else Megatron-Core's uneven split nearest to it: every middle stage
    takes the rounded-up share and the first and last stages (which also hold the embedding and the output layer)
    share the rest."""
    if pp <= 1 or num_layers % pp == 0:
        return Stages(num_layers, pp)
    if pp == 2:
        return Stages(num_layers, 2, first=num_layers // 2, last=num_layers - num_layers // 2)
    for per in (-(-num_layers // pp), num_layers // pp):
        rest = num_layers - (pp - 2) * per
        if per > 0 and rest >= 2:
            return Stages(num_layers, pp, first=rest // 2, last=rest - rest // 2)
    raise ValueError(f"{num_layers} layers cannot fill {pp} pipeline stages")
