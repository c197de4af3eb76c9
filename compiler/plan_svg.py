"""How a placement plan is shown: a node x GPU table for the terminal and the same as an SVG picture.

Both show every node up to SHOW_ALL nodes; beyond that, the first HEAD and the last TAIL nodes with one row
standing for those in between, so that a 1024-node plan stays one screen (the JSON has every node).
"""

from __future__ import annotations

from xml.sax.saxutils import escape, quoteattr

from rlc.compiler.memory import GiB, fill_colour
from rlc.compiler.plan import node_ranges
from rlc.core.plan import ROLE_LETTERS, Plan

SHOW_ALL, HEAD, TAIL = 16, 8, 4
ROLE_NAMES = {"P": "policy", "R": "ref", "C": "critic", "E": "engine"}
FILL = {"P": "#cfe0f3", "R": "#d3ebcd", "C": "#fcdcbf"}
ENGINE_FILLS = ("#e6d6ef", "#d3bde2")  # engines alternate


def shown_nodes(plan: Plan) -> list[int | None]:
    """The node rows to draw; None is the row standing for the nodes left out."""
    if plan.nodes <= SHOW_ALL:
        return list(range(plan.nodes))
    return list(range(HEAD)) + [None] + list(range(plan.nodes - TAIL, plan.nodes))


def _left_out(plan: Plan) -> str:
    a, b = HEAD, plan.nodes - TAIL - 1
    return f"{b - a + 1} nodes ({a}-{b})"


def _amount(x: float) -> str:
    return f"{x:g}"


def summary(plan: Plan) -> list[str]:
    """What the table does not show: the groups, each role's share per rank and the engines' shape."""
    dev = plan.device
    unit = "CPU slots" if dev == "CPU" else "GPUs"
    used = len(plan.cells())
    accel = "" if dev == "CPU" else f" ({plan.accelerator})"
    lines = [
        f"{plan.name}: {plan.nodes} node(s) x {plan.gpus_per_node} {unit}{accel}, "
        f"{used} of {plan.nodes * plan.gpus_per_node} in use",
        "placement groups (PACK):",
    ]
    for pg in plan.placement_groups:
        shape = ", ".join(f"{k}: {v}" for k, v in pg.shape.items())
        lines.append(f"  {pg.name:<10} {len(pg.bundles)} bundle(s) of {{{shape}}}")
    if not plan.placement_groups:
        lines.append("  none")
    lines.append("roles:")
    for r in plan.roles:
        each = f"{_amount(r.share)} CPU" if dev == "CPU" else f"{_amount(r.share)} GPU + {_amount(r.share)} CPU"
        where = f"in {r.placement_group}" if r.placement_group else "no group (Ray places them)"
        nodes = node_ranges(sorted({n for n, _, _ in r.ranks}))
        lines.append(
            f"  {r.name:<7} {ROLE_LETTERS[r.name]}0-{ROLE_LETTERS[r.name]}{len(r.ranks) - 1}  "
            f"{len(r.ranks)} rank(s), {each} each, {where}, nodes {nodes}"
        )
    if plan.engines:
        e = plan.engines[0]
        size = e.tp * e.pp * e.dp
        nodes = node_ranges(sorted({n for x in plan.engines for n in x.nodes}))
        lines.append(
            f"inference ({plan.backend}): {len(plan.engines)} engine(s) of tp {e.tp} x pp {e.pp} x dp {e.dp}"
            f" (ep {e.ep}) = {size} {unit} each, in {plan.engine_group}, nodes {nodes}; "
            f"E<i>.<j> = engine i worker j, {_amount(plan.worker_share)} {dev} per worker"
        )
        spanning = [x.index for x in plan.engines if len(x.nodes) > 1]
        tp_spanning = [x.index for x in plan.engines if x.tp_spans_nodes]
        if spanning:
            lines.append(
                f"  {len(spanning)} engine(s) span nodes; tensor-parallel groups across nodes in {len(tp_spanning)}"
            )
    for remote in plan.remote_engines:
        lines.append(f"remote engine {remote.index} ({remote.kind}): {remote.url}, no {unit} here")
    return lines


def render_table(plan: Plan, color: bool = False) -> str:
    """The summary, then one row per node and one column per GPU listing what runs there."""
    # deferred: rich, only to render a plan's tables
    import io

    from rich import box
    from rich.console import Console
    from rich.table import Table

    cells = plan.cells()
    unit = "cpu" if plan.device == "CPU" else "gpu"
    table = Table(box=box.SIMPLE_HEAD, show_edge=False, collapse_padding=True, header_style="bold" if color else "")
    table.add_column("node", justify="right", no_wrap=True)
    for g in range(plan.gpus_per_node):
        table.add_column(f"{unit}{g}", no_wrap=True)
    for n in shown_nodes(plan):
        if n is None:
            table.add_row("...", *["..."] * plan.gpus_per_node)
            continue
        table.add_row(str(n), *(" ".join(cells.get((n, g), ["-"])) for g in range(plan.gpus_per_node)))
    out = io.StringIO()
    console = Console(
        file=out,
        width=100_000,
        force_terminal=color,
        no_color=not color,
        highlight=False,
        color_system="standard" if color else None,
    )
    console.print(table, overflow="ignore", crop=False)
    rows = [line.rstrip() for line in out.getvalue().splitlines()]
    if None in shown_nodes(plan):
        rows.append(f"... = {_left_out(plan)} left out; --format json lists every node")
    return "\n".join(summary(plan) + [""] + rows)


# -- SVG -------------------------------------------------------------------------------------------

CELL_W, LINE_H, PAD, LEFT, TOP = 96, 16, 4, 72, 84


def render_svg(plan: Plan, memory=None) -> str:
    """The table as a picture: a box per GPU holding a coloured chip per role, the box coloured by its estimated
    memory fill when `memory` (a MemoryEstimate) has one; same plan -> same bytes."""
    cells = plan.cells()
    fills = {(m.node, m.gpu): m for m in (memory.gpus if memory is not None else [])}
    rows = shown_nodes(plan)
    depth = max([len(cells.get((n, g), ())) for n in rows if n is not None for g in range(plan.gpus_per_node)] + [1])
    cell_h = depth * LINE_H + 2 * PAD
    width = LEFT + plan.gpus_per_node * CELL_W + 16
    heights = [cell_h if n is not None else 28 for n in rows]
    height = TOP + sum(heights) + 16
    unit = "cpu" if plan.device == "CPU" else "gpu"
    title = summary(plan)[0]
    out = [
        '<?xml version="1.0" encoding="UTF-8"?>',
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" viewBox="0 0 {width} {height}" '
        'font-family="DejaVu Sans Mono, Menlo, monospace" font-size="11">',
        f"<title>{escape(title)}</title>",
        f'<rect x="0" y="0" width="{width}" height="{height}" fill="#ffffff"/>',
        f'<text x="8" y="20" font-size="14" font-weight="bold">{escape(title)}</text>',
    ]
    x = 8
    for letter, name in ROLE_NAMES.items():
        fill = FILL[letter] if letter != "E" else ENGINE_FILLS[0]
        out.append(_chip(x, 32, 90, f"{letter}: {name}", fill))
        x += 98
    for g in range(plan.gpus_per_node):
        out.append(f'<text x="{LEFT + g * CELL_W + CELL_W // 2}" y="{TOP - 8}" text-anchor="middle">{unit}{g}</text>')
    y = TOP
    for n, h in zip(rows, heights):
        if n is None:
            out.append(
                f'<text x="{LEFT}" y="{y + 18}" fill="#555555">... {escape(_left_out(plan))} not drawn ...</text>'
            )
            y += h
            continue
        out.append(f'<text x="{LEFT - 8}" y="{y + PAD + 12}" text-anchor="end" font-weight="bold">node {n}</text>')
        for g in range(plan.gpus_per_node):
            cx = LEFT + g * CELL_W
            m = fills.get((n, g))
            box = fill_colour(m.fill) if m is not None else "#f7f7f7"
            tip = f"<title>{m.peak / 2**30:.1f} of {m.capacity / 2**30:.1f} GiB ({m.fill:.0%})</title>" if m else ""
            out.append(
                f'<rect x="{cx + 1}" y="{y + 1}" width="{CELL_W - 2}" height="{h - 2}" fill="{box}" stroke="#999999">'
                f"{tip}</rect>"
            )
            for k, label in enumerate(cells.get((n, g), ())):
                out.append(_chip(cx + PAD, y + PAD + k * LINE_H, CELL_W - 2 * PAD, label, _fill(label)))
        y += h
    out.append("</svg>")
    return "\n".join(out) + "\n"


def _fill(label: str) -> str:
    if label[0] == "E":
        return ENGINE_FILLS[int(label[1:].split(".")[0]) % 2]
    return FILL[label[0]]


def _chip(x: int, y: int, w: int, text: str, fill: str) -> str:
    return (
        f'<rect x="{x}" y="{y}" width="{w}" height="{LINE_H - 2}" rx="3" fill={quoteattr(fill)}/>'
        f'<text x="{x + 4}" y="{y + LINE_H - 5}">{escape(text)}</text>'
    )


def render_memory(memory) -> str:
    """The memory estimate under the plan table: the models' sizes, then each GPU's peak / capacity and its
    biggest parts (GPUs with the same figures share a line)."""
    lines = ["", "memory (estimated peak per GPU, every row at its longest; `rlc explain memory` says how):"]
    for role, m in memory.models.items():
        size = f"{m.shape.params / 1e9:.3f}B parameters" if m.shape else "size unknown, left out"
        lines.append(f"  {role}: {m.path} ({size}, from {m.source})")
    if not memory.gpus:
        lines.append("  no GPU check: " + ("CPU-only cluster" if memory.capacity is None else "nothing placed"))
        return "\n".join(lines)
    groups: dict[tuple, list] = {}
    for g in memory.gpus:
        groups.setdefault((g.peak, g.phase, tuple(g.parts.items()), tuple(g.phases.items())), []).append(g)
    for (peak, phase, parts, phases), gpus in groups.items():
        by_node: dict[int, list[int]] = {}
        for g in gpus:
            by_node.setdefault(g.node, []).append(g.gpu)
        where = "; ".join(f"node {n} gpu {node_ranges(sorted(v))}" for n, v in by_node.items())
        first = gpus[0]
        verdict = "fits" if first.fits else "DOES NOT FIT"
        top = ", ".join(f"{k} {v / GiB:.1f}" for k, v in parts[:4])
        lines.append(
            f"  {where}: {peak / GiB:.1f} / {first.capacity / GiB:.1f} GiB ({first.fill:.0%}, {verdict}) "
            f"at {phase}: {top}"
        )
        if len(phases) > 1:
            lines.append("    by phase: " + ", ".join(f"{name} {v / GiB:.1f}" for name, v in phases))
    return "\n".join(lines)


def render_sandbox(sandbox) -> str:
    """The line under the plan that says where model-written code runs (environment.sandbox)."""
    limits = (
        f"{sandbox.memory_mb} MB, {sandbox.max_processes} processes, files {sandbox.file_mb} MB, "
        f"output {sandbox.output_kb} KiB"
    )
    if not sandbox.runs_model_code:
        return f"\nsandbox: {sandbox.isolation}; the default environment runs no model-written code"
    if sandbox.isolation == "unisolated":
        return f"\nsandbox: UNISOLATED: model-written code runs as the trainer, with only limits ({limits}); RLC-W905"
    return f"\nsandbox: bubblewrap, required before training starts ({limits}); docs/sandbox.md"
