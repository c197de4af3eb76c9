"""verl's multi-turn agent loop (`actor_rollout_ref.rollout.multi_turn.*`, `agent.*`), said in verl's terms.

verl's loop lets the model call tools (`multi_turn.tool_config_path`: a list of `class_name`s with their OpenAI
function schemas, called in hermes `<tool_call>` JSON) and hears a simulated user (`interaction_config_path`).
rlc's multi-turn rollouts step SkyRL-Gym environments (docs/multiturn.md), which take the model's text in their own
protocol and score it themselves. A loop with nothing to answer the model (no tool, no interaction) ends after one
assistant turn, which rlc runs as it is; each tool and interaction verl's examples ship is named here with the rlc
environment nearest to it and why that one is not the same job.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rlc.compiler.load import LoadError, parse, read_text
from rlc.core.plain import plain_yaml

# verl's tools and interactions, by class, and why no rlc environment is the same job
NOT_THE_SAME = {
    "verl.tools.gsm8k_tool.Gsm8kTool": "the model submits its answer to a tool (calc_gsm8k_reward) that scores it and "
    "says so; rlc's nearest, SkyRL's gsm8k_multi_turn environment, asks for a retry in its own words, scores strictly "
    "and gives a format score",
    "verl.tools.geo3k_tool.Geo3kTool": "the model submits its answer to a tool (calc_geo3k_reward) about a geometry "
    "figure; rlc trains on text",
    "verl.tools.search_tool.SearchTool": "a retrieval server called with hermes <tool_call> JSON; rlc's nearest, "
    "SkyRL's search environment (Search-R1), reads <search> tags",
    "verl.tools.sandbox_fusion_tools.SandboxFusionTool": "code run by a SandboxFusion server (code_interpreter); rlc "
    "runs model-written code in its own jail only for its code environments (lcb, searchcode)",
    "verl.tools.mcp_search_tool.MCPSearchTool": "an MCP server's search tool; rlc calls no MCP server",
    "verl.interactions.gsm8k_interaction.Gsm8kInteraction": "a simulated user who checks the answer (a flexible "
    "match) and asks for a retry; rlc's nearest, SkyRL's gsm8k_multi_turn environment, matches strictly, gives a "
    "format score and its own prompts",
}


def classes(path: Any, section: str) -> tuple[list[str], str]:
    """The `class_name`s of a verl tool or interaction config (`tools:` or `interaction:`), and "" or why the file
    could not be read."""
    if not isinstance(path, str) or not path or "${" in path:
        return [], f"{path} is known only where the job runs"
    try:
        data = plain_yaml(parse(read_text(Path(path), path), path))
    except LoadError as exc:
        return [], exc.diagnostic.message
    entries = data.get(section) if isinstance(data, dict) else None
    if not isinstance(entries, list):
        return [], f"{path} has no {section}: list"
    return [str(e.get("class_name")) for e in entries if isinstance(e, dict) and e.get("class_name")], ""


def refusal(get, rollout: str) -> str | None:
    """Why rlc does not run this multi-turn job, naming each tool and interaction, or None when the loop has nothing
    to answer the model (one assistant turn: rlc runs it)."""
    mt = f"{rollout}.multi_turn"
    found: list[str] = []
    for key, section in (("tool_config_path", "tools"), ("interaction_config_path", "interaction")):
        path = get(f"{mt}.{key}")
        if path is None:
            continue
        names, unread = classes(path, section)
        if unread:
            return f"a multi-turn agent loop with {section} from {mt}.{key} ({unread}); rlc's multi-turn rollouts step environments"
        found += names
    if get(f"{mt}.function_tool_path"):
        found.append(f"the Python functions of {mt}.function_tool_path")
    if not found:
        return None
    said = "; ".join(f"{name.rsplit('.', 1)[-1]} ({NOT_THE_SAME.get(name, 'a tool or user rlc has no counterpart for')})"
                     for name in found)  # fmt: skip
    return f"verl's multi-turn agent loop ({mt}.enable=true) with {said}"
