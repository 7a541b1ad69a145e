import json
import subprocess
import sys

from streamnet.cli.submit import main


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


def test_bad_option_value_is_a_one_line_error(capsys):
    assert main(["train", "--dataset", "synthetic", "--batch", "0"]) == 2
    assert "error: --batch must be >= 1; got 0" in capsys.readouterr().err


def test_missing_data_directory(tmp_path, capsys):
    assert main(["train", "--dataset", "mnist", "--data", str(tmp_path / "nope")]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_console_scripts_exist():
    r = subprocess.run([sys.executable, "-m", "streamnet.cli.submit", "--help"], capture_output=True, text=True)
    assert r.returncode == 0 and "train" in r.stdout
