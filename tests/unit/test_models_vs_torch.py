"""Losses and gradients equal PyTorch's for the same weights and inputs (1e-4 relative)."""
import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="PyTorch is the reference; install the perf extra")
from streamnet import nn  # noqa: E402
from streamnet.nn import reference  # noqa: E402

CASES = {
    "lenet5-relu-max": (lambda: nn.lenet5(seed=1), 28, 8),
    "lenet5-tanh-avg": (lambda: nn.lenet5(activation="tanh", pool="avg", seed=1), 28, 8),
    "alexnet64": (lambda: nn.alexnet(64, dropout=0.0, seed=1), 64, 4),
    "alexnet64-lrn": (lambda: nn.alexnet(64, dropout=0.0, lrn=True, seed=1), 64, 2),
    "alexnet224": (lambda: nn.alexnet(224, dropout=0.0, seed=1), 224, 2),
}


@pytest.mark.parametrize("case", list(CASES))
def test_loss_and_gradient_equal_pytorch(case):
    build, size, batch = CASES[case]
    torch.set_num_threads(1)
    model = build()
    rng = np.random.default_rng(0)
    x = rng.standard_normal((batch, 1, size, size)).astype(np.float32)
    y = rng.integers(0, 10, batch)
    loss, grad = model.loss_and_grad(x, y)

    seq = reference.torch_module(model)
    ref_loss = torch.nn.functional.cross_entropy(seq(torch.from_numpy(x)), torch.from_numpy(y))
    ref_loss.backward()
    ref_grad = reference.flat_grad(seq)

    assert abs(loss - ref_loss.item()) <= 1e-4 * abs(ref_loss.item())
    # the returned flat gradient is the one compared, tensor by tensor, and covers every parameter
    grads = model.named_grads()
    assert grads and grad.size == ref_grad.size
    np.testing.assert_array_equal(np.concatenate([g.reshape(-1) for _, g in grads]), grad)
    # per parameter tensor, relative to that tensor's gradient scale
    for (name, g), offset in zip(grads, np.cumsum([0] + [v.size for _, v in grads])):
        r = ref_grad[offset:offset + g.size]
        err = np.max(np.abs(g.reshape(-1) - r))
        assert err <= 1e-4 * np.max(np.abs(r)) + 1e-7, f"{name}: max error {err:.3g}"
    np.testing.assert_allclose(model.predict(x), seq.eval()(torch.from_numpy(x)).detach().numpy(),
                               rtol=1e-4, atol=1e-5)
