"""Shell completion (argcomplete) of the three commands, driven as bash drives it: the
command runs with $_ARGCOMPLETE, $COMP_LINE and $COMP_POINT set and writes the
candidates where $_ARGCOMPLETE_STDOUT_FILENAME says, then exits."""
import importlib.util
import os
import subprocess
import sys

import pytest


def complete(module: str, line: str, tmp_path) -> list[str]:
    out = tmp_path / "completions"
    env = {**os.environ, "_ARGCOMPLETE": "1", "_ARGCOMPLETE_IFS": "\n", "_ARGCOMPLETE_STDOUT_FILENAME": str(out),
           "COMP_LINE": line, "COMP_POINT": str(len(line)), "STREAMNET_ZK": ""}
    r = subprocess.run([sys.executable, "-m", module], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert out.exists(), f"{module} did not answer the completion request: {r.stderr}"
    return [c.rstrip(" ") for c in out.read_text().split("\n")]    # a lone candidate ends with a space


@pytest.mark.parametrize("module,line,offered", [
    ("streamnet.cli.submit", "streamnet-submit ", {"train", "submit", "run-example", "--version"}),
    ("streamnet.cli.submit", "streamnet-submit tr", {"train"}),
    ("streamnet.cli.submit", "streamnet-submit train --wo", {"--workers"}),
    ("streamnet.cli.submit", "streamnet-submit train --algorithm ", {"online", "cumulative", "mixbp"}),
    ("streamnet.cli.submit", "streamnet-submit submit lenet5-mixbp --sec", {"--secret-file"}),
    ("streamnet.cli.worker", "streamnet-worker --on-signal ", {"leave", "checkpoint"}),
    ("streamnet.cli.worker", "streamnet-worker --adv", {"--advertise-host"}),
    ("streamnet.ui.cli", "streamnet-ui --p", {"--port", "--poll"}),
])
def test_completion_offers_subcommands_flags_and_choices(module, line, offered, tmp_path):
    got = set(complete(module, line, tmp_path))
    assert offered <= got, got
    word = line.rpartition(" ")[2]
    assert all(c.startswith(word) for c in got), got      # only what fits the word being typed


@pytest.mark.parametrize("module", ["streamnet.cli.submit", "streamnet.cli.worker", "streamnet.ui.cli"])
def test_each_command_carries_the_mark_global_completion_looks_for(module):
    """activate-global-python-argcomplete completes a console script only if the module
    it runs has PYTHON_ARGCOMPLETE_OK in its first 1024 bytes."""
    with open(importlib.util.find_spec(module).origin) as f:
        assert "PYTHON_ARGCOMPLETE_OK" in f.read(1024)
