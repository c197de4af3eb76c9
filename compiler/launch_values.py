"""Values a user writes in a launcher's own syntax, read as that launcher reads them: SkyPilot's accelerator
`TYPE:COUNT`, its `infra` locations and its sizes (`64GB`, `32+`), and durations for Slurm's time limit (`4h`).

Each reader returns rlc's spelling of the value, or raises `Unreadable` with what is wrong and the fix. Resolve writes
what reads (`normalize`), so every target renders one spelling; the rules in rlc.compiler.rules.launch_values refuse
what does not. The grammar follows what each tool accepts: SkyPilot's `Resources` (accelerators, cpus, memory) and its
task schema's `infra` pattern; Slurm's `--time`; KubeRay's names (DNS labels).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from typing import Any

from rlc.core.dataclass import dataclass

# Where SkyPilot provisions (its catalog's clouds, `sky check` lists them); k8s and kubernetes take a context name.
CLOUDS = (
    "aws",
    "azure",
    "gcp",
    "ibm",
    "lambda",
    "scp",
    "oci",
    "runpod",
    "vast",
    "vsphere",
    "cudo",
    "fluidstack",
    "paperspace",
    "primeintellect",
    "do",
    "nebius",
    "ssh",
    "slurm",
    "hyperbolic",
    "seeweb",
    "shadeform",
    "yotta",
    "mithril",
    "verda",
)
KUBERNETES = ("k8s", "kubernetes")
# SkyPilot's size units (its GB is 2**30 bytes, as its Gi); a bare number is GB.
MEMORY_UNITS = {"kb": 2**-20, "mb": 2**-10, "gb": 1, "tb": 2**10, "pb": 2**20}
MEMORY_UNITS.update({unit[0] + "i": factor for unit, factor in MEMORY_UNITS.items()})
DURATION_UNITS = {"s": 1 / 60, "m": 1, "h": 60, "d": 24 * 60}  # a Slurm time limit in minutes
_NUMBER = r"[0-9]+(?:\.[0-9]*)?|\.[0-9]+"
_SIZE = re.compile(rf"^\s*({_NUMBER})\s*([A-Za-z]*)\s*(\+?)\s*$")
_DURATION = re.compile(rf"^\s*({_NUMBER})\s*([smhdSMHD])\s*$")
DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


@dataclass
class Unreadable(Exception):
    message: str
    hint: str


def accelerator(text: str) -> tuple[str, int | None]:
    """`H100` or SkyPilot's `H100:8` (a count per node): the type, and the count when one is written."""
    name, colon, count = str(text).strip().partition(":")
    if not colon:
        return name, None
    if not name or ":" in count:
        raise Unreadable(
            f"cluster.accelerator = {text!r} is neither a GPU type nor SkyPilot's TYPE:COUNT",
            "write the GPU type (e.g. H100) and the GPUs per node in cluster.gpus_per_node",
        )
    try:
        value = float(count)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value <= 0 or value != int(value):
        raise Unreadable(
            f"cluster.accelerator = {text!r}: {count!r} is not a whole number of GPUs; rlc places whole GPUs (a "
            "fraction of one is SkyPilot's way to share a GPU between tasks, which a training job does not)",
            f"write {name} and the GPUs per node in cluster.gpus_per_node",
        )
    return name, int(value)


def size(value: int | float | str, key: str) -> int | float | str:
    """A per-node amount as SkyPilot reads `cpus` and `memory`: N, or N+ for at least N; memory also with a unit
    (KB, MB, GB, TB, PB or KiB-style Ki..Pi, any case; GB is 2**30 bytes). rlc's spelling: a number of CPUs or GB,
    or the string 'N+'."""
    memory = key.endswith("memory_per_node")
    what = "GB" if memory else "CPUs"
    fix = (
        "write the GB per node as a number (64), N+ for at least N (64+), or with SkyPilot's units (64GB, 512MB, 1TB)"
        if memory
        else "write the vCPUs per node as a number (8), or N+ for at least N (8+)"
    )
    if isinstance(value, bool):
        raise Unreadable(f"{key} = {value} is not a number of {what}", fix)
    if isinstance(value, (int, float)):
        if not math.isfinite(value) or value <= 0:
            raise Unreadable(f"{key} = {value} is not a positive number of {what}", fix)
        return value
    m = _SIZE.match(value)
    unit = m.group(2).lower() if m else ""
    if m is None or (unit and (not memory or unit not in MEMORY_UNITS)):
        ambiguous = m is not None and memory and unit in ("k", "m", "g", "t", "p")
        why = (
            f" (a bare {m.group(2)} is 1024-based for Slurm and 1000-based for Kubernetes)"
            if ambiguous and m is not None
            else ""
        )
        raise Unreadable(f"{key} = {value!r} is not a size SkyPilot, Slurm and Kubernetes all read{why}", fix)
    number = float(m.group(1)) * (MEMORY_UNITS[unit] if unit else 1)
    if not number > 0:
        raise Unreadable(f"{key} = {value!r} is not a positive number of {what}", fix)
    shown: int | float = int(number) if number == int(number) else round(number, 6)
    return f"{shown}+" if m.group(3) else shown


def infra(text: str) -> str:
    """SkyPilot's `cloud[/region[/zone]]`, `k8s[/context]` or `*` wildcards, as its task schema takes them."""
    parts = str(text).strip().split("/")
    cloud = parts[0].strip().lower()
    fix = "write cloud[/region[/zone]] (aws/us-east-1), k8s[/context], or * for any cloud (*/us-east-1)"
    if cloud in KUBERNETES:
        if len(parts) > 1 and not "/".join(parts[1:]).strip():
            raise Unreadable(f"cluster.infra = {text!r} names no Kubernetes context after the '/'", fix)
        return str(text).strip()
    if cloud != "*" and cloud not in CLOUDS:
        head = re.split(r"[:\s,]", cloud, maxsplit=1)[0]
        if head in CLOUDS or head in KUBERNETES:
            rest = re.split(r"[:\s,]+", str(text).strip())[1:]
            better = "/".join([head, *rest])
            raise Unreadable(
                f"cluster.infra = {text!r}: SkyPilot separates cloud, region and zone with '/'", f"write {better}"
            )
        import difflib  # deferred: only a wrong name needs a close match

        close = difflib.get_close_matches(cloud, [*CLOUDS, *KUBERNETES], n=1)
        raise Unreadable(
            f"cluster.infra = {text!r}: {parts[0]!r} is not a cloud SkyPilot provisions on",
            f"did you mean {close[0]}?" if close else fix,
        )
    if len(parts) > 3 or any(not p.strip() for p in parts):
        raise Unreadable(f"cluster.infra = {text!r} is not cloud[/region[/zone]]", fix)
    return str(text).strip()


def slurm_time(value: int | str) -> int | str:
    """A Slurm time limit; a duration with a unit (90m, 4h, 2d, as SkyPilot writes them) becomes minutes."""
    if isinstance(value, int) or not isinstance(value, str):
        return value
    m = _DURATION.match(value)
    if m is None:
        return value  # Slurm's own forms; the spec's pattern refuses the rest
    minutes = float(m.group(1)) * DURATION_UNITS[m.group(2).lower()]
    return max(math.ceil(minutes), 1)


def normalize(get, derive) -> None:
    """Rewrite every readable value in rlc's spelling (`derive(path, value, sources)`); an unreadable one, or an
    accelerator count that contradicts cluster.gpus_per_node, is left as written for the rules to report."""
    acc = get("cluster.accelerator")
    if isinstance(acc, str) and ":" in acc:
        try:
            name, count = accelerator(acc)
        except Unreadable:
            pass
        else:
            per_node = get("cluster.gpus_per_node")
            if per_node is None or per_node == count:
                derive("cluster.accelerator", name, ["cluster.accelerator"])
                if per_node is None:
                    derive("cluster.gpus_per_node", count, ["cluster.accelerator"])
    for key, read in READERS.items():
        value = get(key)
        if value is None:
            continue
        try:
            new = read(value, key)
        except Unreadable:
            continue
        if new != value or type(new) is not type(value):
            derive(key, new, [key])


READERS: dict[str, Callable[[Any, str], Any]] = {
    "cluster.cpus_per_node": size,
    "cluster.memory_per_node": size,
    "cluster.infra": lambda value, key: infra(value),
    "launch.slurm.time_limit": lambda value, key: slurm_time(value),
}
