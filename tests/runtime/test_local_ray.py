"""The local Ray instance `rlc run` starts is this run's own: Ray's token authentication stays on (another account on
a shared machine cannot join it and run code as this user), without Ray's warning about it and without a token file
left in the user's HOME."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import textwrap

import pytest

pytest.importorskip("ray")

START = textwrap.dedent(
    """
    import os, sys
    import ray
    from rlc.runtime.placement import private_local_instance

    private_local_instance()
    ray.init(num_cpus=1, include_dashboard=False)
    print("ADDRESS", ray.get_runtime_context().gcs_address, flush=True)
    print("MODE", os.environ.get("RAY_AUTH_MODE"), flush=True)
    sys.stdin.read()  # keep the instance up until the test closes stdin
    ray.shutdown()
    """
)

JOIN = textwrap.dedent(
    """
    import sys
    import ray

    try:
        ray.init(address=sys.argv[1])
    except Exception as exc:
        print("REFUSED", type(exc).__name__, exc, flush=True)
        sys.exit(3)
    print("JOINED", flush=True)
    """
)


@pytest.fixture
def clean_env(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env.update(HOME=str(tmp_path / "home"), RAY_USAGE_STATS_ENABLED="0", RAY_TMPDIR=tempfile.mkdtemp(dir="/tmp"))
    os.makedirs(env["HOME"])
    return env


def test_the_local_instance_keeps_token_auth_quietly_and_leaves_no_token_file(clean_env):
    started = subprocess.Popen(
        [sys.executable, "-c", START],
        env=clean_env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        lines: dict[str, str] = {}
        assert started.stdout is not None
        for line in started.stdout:
            key, _, value = line.strip().partition(" ")
            lines[key] = value
            if "MODE" in lines:
                break
        assert "ADDRESS" in lines, started.stderr.read() if started.stderr else ""
        assert lines["MODE"] == "token", "Ray's own default for a new local instance, kept"
        # Without the run's token, another process (another account's, say) cannot join the instance.
        joined = subprocess.run(
            [sys.executable, "-c", JOIN, lines["ADDRESS"]],
            env=clean_env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert joined.returncode == 3 and "REFUSED" in joined.stdout, joined.stdout + joined.stderr[-2000:]
    finally:
        out, err = started.communicate(input="", timeout=120)
    assert "Token authentication is enabled" not in err + out
    assert not os.path.exists(os.path.join(clean_env["HOME"], ".ray", "auth_token"))


def test_an_explicit_auth_mode_or_token_is_the_users():
    script = textwrap.dedent(
        """
        import os
        from rlc.runtime.placement import private_local_instance
        private_local_instance()
        print(os.environ.get("RAY_AUTH_MODE"), os.environ.get("RAY_AUTH_TOKEN"))
        """
    )
    base = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    for extra, expected in [
        ({"RAY_AUTH_MODE": "disabled"}, "disabled None"),
        ({"RAY_AUTH_TOKEN": "mine"}, "None mine"),
    ]:
        out = subprocess.run([sys.executable, "-c", script], env={**base, **extra}, capture_output=True, text=True)
        assert out.stdout.strip() == expected, out.stderr
