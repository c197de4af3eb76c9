"""Slurm: what the batch script cannot carry or would contradict, decided before anything is submitted.

The names on `#SBATCH` lines are checked by the spec's patterns (rlc.spec.launch); these rules see the values a
pattern cannot judge alone. They apply when launch.target is slurm.
"""

from __future__ import annotations

from rlc.compiler.rules.base import Context, rule
from rlc.compiler.targets.slurm import sbatch_word

TARGET = "launch.target"
SIZES = ("cluster.cpus_per_node", "cluster.memory_per_node")
NODES = "ask Slurm for such nodes in launch.slurm (partition, constraint, sbatch_args) and remove {key}"
# SkyPilot's settings the Slurm batch script has no place for: key, the value that means "not set", the fix.
UNUSED: tuple[tuple[str, object, str], ...] = (
    (
        "launch.install",
        None,
        "install rlc[runtime] in the environment you submit from (or activate one in launch.setup) and remove "
        "launch.install",
    ),
    ("launch.ports", [], "Slurm opens no ports to the outside: remove launch.ports"),
    ("cluster.infra", None, NODES),
    ("cluster.use_spot", False, NODES),
    (
        "cluster.image",
        None,
        "run in a container through your site's Slurm plugin (e.g. pyxis: --container-image in sbatch_args) and "
        "remove cluster.image",
    ),
    ("cluster.instance_type", None, NODES),
    ("cluster.disk_size", None, NODES),
    ("cluster.disk_tier", None, NODES),
    ("cluster.network_tier", None, NODES),
)


def _value(c: Context, key: str):
    value = c.s
    for part in key.split("."):
        value = getattr(value, part)
    return value


def _written(c: Context) -> dict[str, str]:
    """sbatch's option names rlc writes for this spec, each with the key that decides it."""
    s = c.s
    out = {"job-name": "name", "nodes": "cluster.num_nodes", "ntasks": "cluster.num_nodes"}
    out["ntasks-per-node"] = "cluster.num_nodes"
    if s.cluster.accelerator != "none":
        out.update(dict.fromkeys(("gres", "gpus", "gpus-per-node", "gpus-per-task"), "cluster.gpus_per_node"))
    if s.cluster.cpus_per_node is not None or s.cluster.accelerator == "none":
        out["cpus-per-task"] = (
            "cluster.cpus_per_node" if s.cluster.cpus_per_node is not None else "cluster.gpus_per_node"
        )
    if s.cluster.memory_per_node is not None:
        out.update(dict.fromkeys(("mem", "mem-per-cpu", "mem-per-gpu"), "cluster.memory_per_node"))
    if s.launch.slurm.requeue:
        out.update(dict.fromkeys(("requeue", "no-requeue", "signal", "open-mode"), "launch.slurm.requeue"))
    for flag, key in (("time", "time_limit"), *((k, k) for k in ("partition", "account", "qos", "constraint"))):
        if getattr(s.launch.slurm, key) is not None:
            out[flag] = f"launch.slurm.{key}"
    if s.launch.workdir not in (None, "."):
        out["chdir"] = "launch.workdir"
    return out


def _option(name: str, written: dict[str, str]) -> str | None:
    """The option rlc writes that `name` stands for: itself, or an abbreviation sbatch would expand to it."""
    if name in written:
        return name
    longer = [o for o in written if o.startswith(name)]
    return longer[0] if len(name) >= 4 and len(longer) == 1 else None


@rule("RLC-E910", "Slurm: the working directory is one line", "launch.workdir", TARGET)
def slurm_values(c: Context):
    """(Cluster sizes Slurm cannot read are RLC-E921's, for every target.)"""
    if c.s.launch.target != "slurm":
        return
    workdir = c.s.launch.workdir
    if workdir is not None and sbatch_word(workdir) is None:
        yield c.error(
            "RLC-E910",
            "launch.workdir",
            "launch.workdir has a newline or another control character, which no #SBATCH line can carry",
            "write the directory on one line",
        )


@rule(
    "RLC-E911",
    "Slurm: sbatch_args do not set what rlc writes from the spec",
    "launch.slurm",
    "cluster.accelerator",
    *SIZES,
    "launch.workdir",
    TARGET,
)
def slurm_args_own_options(c: Context):
    if c.s.launch.target != "slurm":
        return
    written = _written(c)
    for i, option in enumerate(c.s.launch.slurm.sbatch_args):
        name = option.removeprefix("--").partition("=")[0]
        own = _option(name, written)
        if own is not None:
            yield c.error(
                "RLC-E911",
                f"launch.slurm.sbatch_args[{i}]",
                f"--{name} sets what rlc already writes as --{own} from {written[own]}; sbatch would take the later "
                "one and the job would not be the one compiled",
                f"set {written[own]} instead and remove this item",
            )


# sbatch's long options (Slurm 22.05 to 24.11, its man page): an item naming none of them, even abbreviated as getopt
# allows, makes sbatch refuse the whole script.
SBATCH_OPTIONS = frozenset(
    """account acctg-freq array batch bb bbf begin chdir cluster-constraint clusters comment constraint container
    container-id contiguous core-spec cores-per-socket cpu-freq cpus-per-gpu cpus-per-task deadline delay-boot
    dependency distribution error exclude exclusive export export-file extra extra-node-info get-user-env gid gpu-bind
    gpu-freq gpus gpus-per-node gpus-per-socket gpus-per-task gres gres-flags hint hold ignore-pbs input job-name
    kill-on-invalid-dep licenses mail-type mail-user mcs-label mem mem-bind mem-per-cpu mem-per-gpu mincpus network
    nice no-kill no-requeue nodefile nodelist nodes ntasks ntasks-per-core ntasks-per-gpu ntasks-per-node
    ntasks-per-socket oom-kill-step open-mode output overcommit oversubscribe parsable partition power prefer priority
    profile propagate qos quiet reboot requeue reservation resv-ports segment signal sockets-per-node spread-job stepmgr
    switches test-only thread-spec threads-per-core time time-min tmp tres-bind tres-per-task uid use-min-nodes verbose
    wait wait-all-nodes wckey wrap""".split()
)


@rule("RLC-E912", "Slurm: every item of sbatch_args is an option sbatch has", "launch.slurm", TARGET)
def slurm_args_known(c: Context):
    if c.s.launch.target != "slurm":
        return
    for i, option in enumerate(c.s.launch.slurm.sbatch_args):
        name = option.removeprefix("--").partition("=")[0]
        longer = sorted(o for o in SBATCH_OPTIONS if o.startswith(name))
        if name in SBATCH_OPTIONS or len(longer) == 1:
            continue
        import difflib  # deferred: only a wrong name needs a close match

        close = difflib.get_close_matches(name, sorted(SBATCH_OPTIONS), n=1)
        if longer:
            what, fix = f"--{name} abbreviates several sbatch options ({', '.join(longer[:4])})", "write it in full"
        else:
            what = f"sbatch has no option --{name}"
            fix = f"did you mean --{close[0]}?" if close else "write one of sbatch's long options (man sbatch)"
        yield c.error(
            "RLC-E912", f"launch.slurm.sbatch_args[{i}]", f"{what}: it would refuse the whole batch script", fix
        )


@rule("RLC-W910", "Slurm: SkyPilot's settings have no place in the batch script", *(k for k, _, _ in UNUSED), TARGET)
def slurm_unused(c: Context):
    if c.s.launch.target != "slurm":
        return
    for key, unset, fix in UNUSED:
        if _value(c, key) != unset:
            yield c.warning(
                "RLC-W910",
                key,
                f"{key} is set but the slurm target does not use it: the job runs on the nodes Slurm gives it, in "
                "the environment sbatch was called from",
                fix.format(key=key),
            )


RULES = (slurm_values, slurm_args_own_options, slurm_args_known, slurm_unused)
