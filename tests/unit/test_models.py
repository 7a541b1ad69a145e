import numpy as np
import pytest

from streamnet import nn


def test_lenet5_layout_and_names():
    m = nn.lenet5()
    names = [n for n, _ in m.named_params()]
    assert names == ["conv1.weight", "conv1.bias", "conv2.weight", "conv2.bias", "fc1.weight",
                     "fc1.bias", "fc2.weight", "fc2.bias", "fc3.weight", "fc3.bias"]
    shapes = dict((n, v.shape) for n, v in m.named_params())
    assert shapes["conv1.weight"] == (6, 1, 5, 5) and shapes["fc1.weight"] == (120, 400)
    assert m.num_params == 61706
    # views, not copies: writing the flat vector changes the layer weights
    m.params[:] = 3.0
    assert np.all(dict(m.named_params())["fc3.bias"] == 3.0)


def test_alexnet_sizes():
    assert nn.alexnet(64).num_params == 7703242
    a224 = nn.alexnet(224)
    assert dict(a224.named_params())["fc1.weight"].shape == (4096, 6400)


def test_init_is_seeded():
    a, b, c = nn.lenet5(seed=3), nn.lenet5(seed=3), nn.lenet5(seed=4)
    np.testing.assert_array_equal(a.params, b.params)
    assert not np.array_equal(a.params, c.params)
    w = dict(a.named_params())["fc1.weight"]
    assert np.abs(w).max() <= 1 / np.sqrt(400)


def test_spec_round_trip_rebuilds_the_same_function():
    m = nn.lenet5(activation="tanh", pool="avg", seed=1)
    r = nn.Model.from_spec(m.spec(), m.params)
    x = np.random.default_rng(0).standard_normal((3, 1, 28, 28)).astype(np.float32)
    np.testing.assert_array_equal(m.predict(x), r.predict(x))
    assert r.spec() == m.spec()


def test_bad_options_name_the_field():
    with pytest.raises(ValueError, match="activation must be one of relu, tanh, sigmoid"):
        nn.lenet5(activation="gelu")
    with pytest.raises(ValueError, match="input_size must be 64 or 224"):
        nn.alexnet(input_size=100)
    with pytest.raises(ValueError, match="unknown layer type 'bogus'"):
        nn.Model.from_spec({"input_shape": [1, 28, 28], "layers": [{"type": "bogus"}]})


def test_wrong_input_shape_and_labels_are_clear_errors():
    m = nn.lenet5()
    with pytest.raises(ValueError, match=r"expected input of shape \(N, 1, 28, 28\)"):
        m.forward(np.zeros((2, 1, 32, 32), np.float32))
    with pytest.raises(ValueError, match="labels must lie in"):
        m.loss_and_grad(np.zeros((2, 1, 28, 28), np.float32), np.array([0, 10]))


def test_model_gradient_matches_finite_differences():
    """End-to-end check of the chain of layers, in float32 with a tolerant step."""
    m = nn.lenet5(activation="tanh", pool="avg", seed=2)
    rng = np.random.default_rng(5)
    x = rng.standard_normal((4, 1, 28, 28)).astype(np.float32)
    y = rng.integers(0, 10, 4)
    _, g = m.loss_and_grad(x, y)
    g = g.copy()
    base = m.params.copy()
    v = rng.standard_normal(base.size).astype(np.float32)
    v /= np.linalg.norm(v)
    eps = 1e-2
    m.set_params(base + eps * v)
    lp, _ = m.loss_and_grad(x, y)
    m.set_params(base - eps * v)
    lm, _ = m.loss_and_grad(x, y)
    numeric = (lp - lm) / (2 * eps)
    assert abs(float(g @ v) - numeric) < 2e-3 * max(1.0, abs(numeric))


@pytest.mark.parametrize("build", [lambda: nn.lenet5(activation="tanh", pool="avg"),
                                   lambda: nn.lenet5(activation="sigmoid"),
                                   lambda: nn.alexnet(64, lrn=True)])
def test_float32_all_the_way(build):
    m = build()
    size = m.input_shape[1]
    x = np.random.default_rng(0).standard_normal((2, 1, size, size)).astype(np.float32)
    h = x
    for layer in m.layers:
        h = layer.forward(h, train=True)
        assert h.dtype == np.float32, layer.type


@pytest.mark.parametrize("build", [lambda: nn.lenet5(seed=7), lambda: nn.alexnet(64, dropout=0.0, seed=7)])
def test_relu_then_maxpool_runs_pool_first_and_fused_steps_bit_identically(build):
    m = build()
    kinds = [l.type for l in m._order]
    assert "maxpool" not in kinds and "conv2d+maxpool" in kinds    # every pool follows a conv
    assert "dense+relu" in kinds and "dense" in kinds               # fc1, fc2 fused; fc3 alone
    assert m._order[0].wide == (m.layers[0].cin == 1 and m.layers[0].stride == 1)  # LeNet-5's conv1
    size = m.input_shape[1]
    rng = np.random.default_rng(8)
    x = rng.standard_normal((3, 1, size, size)).astype(np.float32)
    x[0, 0, :4, :4] = -1.0  # windows whose ReLU output is all zero (ties)
    y = rng.integers(0, 10, 3)
    loss, g = m.loss_and_grad(x, y)
    g = g.copy()
    m._order = list(m.layers)  # the declared order
    loss_plain, g_plain = m.loss_and_grad(x, y)
    assert loss == loss_plain
    np.testing.assert_array_equal(g, g_plain)
