"""`streamnet-submit export`: a checkpoint's weights as safetensors (written by hand,
read back by the `safetensors` package) and as a PyTorch state_dict, loading into
LeNet-5 and AlexNet written as a PyTorch user writes them; outputs equal to 1e-5."""
import json

import numpy as np
import pytest

from streamnet import nn
from streamnet.cli import submit
from streamnet.training.checkpoint import write_checkpoint
from streamnet.training.config import lenet5_mixbp, run_config_to_dict, with_overrides
from streamnet.training.export import ExportError, export

from tests.unit.test_cli_mistakes import one_line_error, run_main


def _checkpoint(tmp_path, model_name: str, options: dict, params=None, with_config=True):
    cfg = with_overrides(lenet5_mixbp(), {"dataset": "fashion-mnist"})
    if model_name == "alexnet":
        from streamnet.training.config import SETUPS
        cfg = with_overrides(SETUPS["alexnet-mixbp"](), dict(options))
    net = nn.build_model(model_name, seed=3, **options)
    if params is not None:
        net.set_params(params)
    state = {"config": run_config_to_dict(cfg)} if with_config else None
    return write_checkpoint(str(tmp_path), "run", 7, net.params, state)["path"], net


def _torch_models():
    torch = pytest.importorskip("torch", reason="PyTorch loads the export; install the perf extra")
    F = torch.nn.functional

    class LeNet5(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1 = torch.nn.Conv2d(1, 6, 5, padding=2)
            self.conv2 = torch.nn.Conv2d(6, 16, 5)
            self.fc1 = torch.nn.Linear(16 * 5 * 5, 120)
            self.fc2 = torch.nn.Linear(120, 84)
            self.fc3 = torch.nn.Linear(84, 10)

        def forward(self, x):
            x = F.max_pool2d(F.relu(self.conv1(x)), 2)
            x = F.max_pool2d(F.relu(self.conv2(x)), 2)
            x = torch.flatten(x, 1)
            return self.fc3(F.relu(self.fc2(F.relu(self.fc1(x)))))

    class AlexNet64(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1 = torch.nn.Conv2d(1, 64, 5, stride=2, padding=2)
            self.conv2 = torch.nn.Conv2d(64, 192, 5, padding=2)
            self.conv3 = torch.nn.Conv2d(192, 384, 3, padding=1)
            self.conv4 = torch.nn.Conv2d(384, 256, 3, padding=1)
            self.conv5 = torch.nn.Conv2d(256, 256, 3, padding=1)
            self.fc1 = torch.nn.Linear(256 * 4 * 4, 1024)
            self.fc2 = torch.nn.Linear(1024, 1024)
            self.fc3 = torch.nn.Linear(1024, 10)
            self.drop = torch.nn.Dropout(0.5)

        def forward(self, x):
            x = F.max_pool2d(F.relu(self.conv1(x)), 2)
            x = F.max_pool2d(F.relu(self.conv2(x)), 2)
            x = F.relu(self.conv4(F.relu(self.conv3(x))))
            x = F.max_pool2d(F.relu(self.conv5(x)), 2)
            x = torch.flatten(x, 1)
            x = self.drop(F.relu(self.fc1(x)))
            return self.fc3(self.drop(F.relu(self.fc2(x))))
    return torch, {"lenet5": (LeNet5, {}, 28), "alexnet": (AlexNet64, {"input_size": 64}, 64)}


def assert_same_outputs(torch, module, net, size: int):
    torch.set_num_threads(1)
    x = np.random.default_rng(0).standard_normal((4, 1, size, size)).astype(np.float32)
    with torch.no_grad():
        theirs = module.eval()(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(theirs, net.predict(x), rtol=1e-5, atol=1e-5)


def load_safetensors(path):
    st = pytest.importorskip("safetensors.numpy", reason="the safetensors package reads the file back")
    from safetensors import safe_open
    with safe_open(path, framework="numpy") as f:
        meta = f.metadata()
    return st.load_file(path), meta


@pytest.mark.parametrize("name", ["lenet5", "alexnet"])
def test_safetensors_and_torch_exports_load_into_the_torch_model(name, tmp_path):
    torch, models = _torch_models()
    cls, options, size = models[name]
    path, net = _checkpoint(tmp_path, name, options)
    export(path, str(tmp_path / "w.safetensors"), "safetensors")
    tensors, meta = load_safetensors(str(tmp_path / "w.safetensors"))
    assert set(tensors) == {k for k, _ in net.named_params()}
    for k, v in net.named_params():
        np.testing.assert_array_equal(tensors[k], v)
    assert meta["model"] == name and json.loads(meta["input_shape"]) == [1, size, size]
    assert meta["num_classes"] == "10" and meta["step"] == "7"
    module = cls()
    module.load_state_dict({k: torch.from_numpy(v) for k, v in tensors.items()})    # strict: every name matches
    assert_same_outputs(torch, module, net, size)

    export(path, str(tmp_path / "w.pt"), "torch")
    module = cls()
    module.load_state_dict(torch.load(str(tmp_path / "w.pt"), weights_only=True))
    assert_same_outputs(torch, module, net, size)


def test_normalisation_of_the_dataset_travels_in_the_metadata(tmp_path):
    path, _ = _checkpoint(tmp_path, "lenet5", {})
    export(path, str(tmp_path / "w.safetensors"))
    _, meta = load_safetensors(str(tmp_path / "w.safetensors"))
    assert meta["dataset"] == "fashion-mnist"
    assert json.loads(meta["normalize"]) == {"scale": 1 / 255, "mean": 0.2860, "std": 0.3530}


def test_the_format_is_the_documented_layout(tmp_path):
    """Read back without the safetensors package: u64 header length, JSON header, data."""
    path, net = _checkpoint(tmp_path, "lenet5", {})
    out = tmp_path / "w.safetensors"
    export(path, str(out))
    raw = out.read_bytes()
    n = int.from_bytes(raw[:8], "little")
    assert n % 8 == 0
    header = json.loads(raw[8:8 + n])
    data = raw[8 + n:]
    assert len(data) == net.num_params * 4
    for k, v in net.named_params():
        h = header[k]
        assert h["dtype"] == "F32" and h["shape"] == list(v.shape)
        got = np.frombuffer(data[h["data_offsets"][0]:h["data_offsets"][1]], "<f4").reshape(v.shape)
        np.testing.assert_array_equal(got, v)


def test_a_parameters_only_checkpoint_needs_the_model(tmp_path, capsys):
    path, net = _checkpoint(tmp_path, "lenet5", {}, with_config=False)
    with pytest.raises(ExportError, match="holds parameters only.*--model"):
        export(path, str(tmp_path / "w.safetensors"))
    assert export(path, str(tmp_path / "w.safetensors"), model="lenet5").num_params == net.num_params
    with pytest.raises(ExportError, match="which no alexnet .* has"):
        export(path, str(tmp_path / "w.safetensors"), model="alexnet", input_size=64)


def test_export_mistakes_are_one_line(tmp_path, capsys):
    path, _ = _checkpoint(tmp_path, "lenet5", {})
    assert run_main(submit.main, ["export", str(tmp_path / "absent.ckpt"), str(tmp_path / "w.safetensors")]) == 2
    assert "cannot read checkpoint" in one_line_error(capsys, "streamnet-submit")
    assert run_main(submit.main, ["export", path, "/no/such/dir/w.safetensors"]) == 2
    assert "directory /no/such/dir does not exist" in one_line_error(capsys, "streamnet-submit")
    assert run_main(submit.main, ["export", path, str(tmp_path / "w.x"), "--format", "onnx"]) == 2
    assert "argument --format: invalid choice" in one_line_error(capsys, "streamnet-submit")
    assert run_main(submit.main, ["export", path, str(tmp_path / "w.safetensors")]) == 0
    assert "wrote 61,706 parameters" in capsys.readouterr().err


def test_a_model_that_disagrees_with_the_recorded_one_is_refused_not_ignored(tmp_path):
    path, net = _checkpoint(tmp_path, "lenet5", {})
    out = str(tmp_path / "w.safetensors")
    with pytest.raises(ExportError, match="records its network, lenet5 with input size 28; --model alexnet"):
        export(path, out, model="alexnet", input_size=64)
    with pytest.raises(ExportError, match="--input-size 32 disagrees"):
        export(path, out, model="lenet5", input_size=32)
    assert export(path, out, model="lenet5").num_params == net.num_params     # the same: fine


@pytest.mark.parametrize("state,shape,says", [
    (5, None, "its state is a int, not a mapping"),
    ({"config": {"model": 7}}, None, "its run configuration cannot be read"),
    ({"config": "x"}, None, "its run configuration cannot be read"),
    ({"config": {"model": {"name": "lenet5"}, "data": {"trahn_limit": 5}}}, None,
     "its run configuration cannot be read"),
    (None, (2, 30853), "its parameters are not a flat vector (shape (2, 30853))"),
])
def test_a_checkpoint_whose_content_export_cannot_use_is_one_line(state, shape, says, tmp_path, capsys):
    """Unkeyed files anyone can write (and, since export holds no secret, tampered cluster
    ones): each was a traceback (AttributeError, KeyError, TypeError), or for 2-D
    parameters "61706 values, model needs 61706"."""
    params = nn.build_model("lenet5", seed=3).params
    path = write_checkpoint(str(tmp_path), "odd", 7, params.reshape(shape) if shape else params, state)["path"]
    assert run_main(submit.main, ["export", path, str(tmp_path / "w.safetensors"), "--model", "lenet5"]) == 2
    line = one_line_error(capsys, "streamnet-submit")
    assert f"{path} is not a usable checkpoint: {says}" in line, line


def test_an_export_that_fails_part_way_leaves_an_existing_out_as_it_was(tmp_path, monkeypatch):
    import streamnet.training.export as ex
    path, _ = _checkpoint(tmp_path, "lenet5", {})
    out = tmp_path / "w.safetensors"
    out.write_bytes(b"the previous export")

    def full_disk(p, tensors, metadata):
        with open(p, "wb") as f:
            f.write(b"half")
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(ex, "write_safetensors", full_disk)
    with pytest.raises(ExportError, match="No space left on device"):
        export(path, str(out))
    assert out.read_bytes() == b"the previous export" and sorted(p.name for p in tmp_path.iterdir()
                                                                if "w." in p.name) == ["w.safetensors"]


def test_two_exports_to_one_out_at_once_both_finish_and_a_users_partial_file_is_left_alone(tmp_path, monkeypatch):
    # both wrote OUT.partial: the second truncated the first's half-written file and renamed it
    # over OUT, the first then found no OUT.partial to rename and failed; a file of the user's
    # of that name was overwritten, then renamed away
    import os
    import streamnet.training.export as ex
    path, net = _checkpoint(tmp_path, "lenet5", {})
    out = tmp_path / "w.safetensors"
    users = tmp_path / "w.safetensors.partial"
    users.write_bytes(b"the user's own")
    real = ex.write_safetensors
    calls = []

    def the_other_export_runs_meanwhile(p, tensors, metadata):
        calls.append(p)
        if len(calls) == 1:
            export(path, str(out))
        real(p, tensors, metadata)
    monkeypatch.setattr(ex, "write_safetensors", the_other_export_runs_meanwhile)
    export(path, str(out))
    assert len(calls) == 2 and calls[0] != calls[1]
    assert users.read_bytes() == b"the user's own"
    assert sorted(p.name for p in tmp_path.iterdir() if "w." in p.name) == ["w.safetensors", "w.safetensors.partial"]
    tensors, _ = load_safetensors(str(out))                  # whole, not the two halves of two writes
    expected = ex.state_dict(net)
    assert sorted(tensors) == sorted(expected) and all(np.array_equal(tensors[k], expected[k]) for k in expected)
    umask = os.umask(0)
    os.umask(umask)
    assert out.stat().st_mode & 0o777 == 0o666 & ~umask      # a file's usual mode, not mkstemp's 0600
