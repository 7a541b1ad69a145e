import json

from streamnet.cli.submit import main

from tests.unit.test_cli_mistakes import run_main


def test_train_writes_a_summary(tmp_path, capsys):
    out = tmp_path / "s.json"
    rc = main(["train", "--dataset", "synthetic", "--epochs", "1", "--workers", "2", "--local",
               "--summary", str(out)])
    assert rc == 0
    s = json.loads(out.read_text())
    for key in ("model", "dataset", "algorithm", "epochs", "test_accuracy", "samples_per_s", "wall_s"):
        assert key in s
    assert s["units"] == 2 and s["algorithm"] == "mixbp"
    assert "final test accuracy" in capsys.readouterr().out


def test_missing_data_directory(tmp_path, capsys):
    assert main(["train", "--dataset", "mnist", "--data", str(tmp_path / "nope")]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_the_declared_console_scripts_are_installed_and_load(capsys):
    """pyproject.toml's [project.scripts] are the installed distribution's console-script
    entry points (streamnet-submit, streamnet-worker, ...), and each loads a callable."""
    import tomllib
    from importlib.metadata import distribution
    from pathlib import Path
    declared = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())["project"]["scripts"]
    assert {"streamnet-submit", "streamnet-worker"} <= declared.keys()
    installed = {e.name: e for e in distribution("streamnet").entry_points if e.group == "console_scripts"}
    assert {name: e.value for name, e in installed.items()} == declared
    for name in declared:
        assert callable(installed[name].load()), name
    assert run_main(installed["streamnet-submit"].load(), ["--help"]) == 0
    assert "train" in capsys.readouterr().out
