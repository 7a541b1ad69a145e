import gzip

import numpy as np
import pytest

from streamnet.data import (batch_slices, epoch_order, load_dataset, load_idx_dir, read_idx,
                            resize, shard_indices, shard_sizes, synthetic, write_idx)
from streamnet.errors import DataError


@pytest.mark.parametrize("dtype", [np.uint8, np.int8, np.int16, np.int32, np.float32, np.float64])
@pytest.mark.parametrize("suffix", ["", ".gz"])
def test_idx_round_trip(tmp_path, dtype, suffix):
    a = (np.arange(24).reshape(2, 3, 4) - 5).astype(dtype)
    p = tmp_path / f"a{suffix}"
    write_idx(p, a)
    b = read_idx(p)
    assert b.dtype == np.dtype(dtype) and b.shape == a.shape
    np.testing.assert_array_equal(a, b)


def _raw(tmp_path, data: bytes, name="bad"):
    p = tmp_path / name
    p.write_bytes(data)
    return p


GOOD = bytes([0, 0, 8, 2]) + np.array([2, 3], ">u4").tobytes() + bytes(range(6))


@pytest.mark.parametrize("data,message", [
    (b"", "too short for an IDX header"),
    (b"\x01\x00\x08\x01" + bytes(8), "bad IDX magic"),
    (bytes([0, 0, 0x42, 1]) + bytes(8), "unknown IDX dtype code 0x42"),
    (bytes([0, 0, 8, 0]), "0 dimensions"),
    (bytes([0, 0, 8, 3]) + bytes(5), "truncated header"),
    (GOOD[:-1], "truncated: dimensions (2, 3) need 18 bytes, file has 17"),
    (GOOD + b"x", "1 bytes of trailing data"),
])
def test_corrupt_idx_is_a_clear_error(tmp_path, data, message):
    p = _raw(tmp_path, data)
    with pytest.raises(DataError) as err:
        read_idx(p)
    assert str(p) in str(err.value) and message in str(err.value)


def test_truncated_and_corrupt_gzip(tmp_path):
    z = gzip.compress(GOOD)
    with pytest.raises(DataError, match="corrupt gzip"):
        read_idx(_raw(tmp_path, z[: len(z) // 2], "t.gz"))
    with pytest.raises(DataError, match="corrupt gzip"):
        read_idx(_raw(tmp_path, z[:10] + b"\xff" * 10 + z[20:], "c.gz"))


def test_missing_file(tmp_path):
    with pytest.raises(DataError, match="file not found"):
        read_idx(tmp_path / "nope")


def _write_dir(d, n_train=20, n_test=10, size=28, label_count=None, test_size=None):
    rng = np.random.default_rng(0)
    write_idx(d / "train-images-idx3-ubyte.gz", rng.integers(0, 255, (n_train, size, size), dtype=np.uint8))
    write_idx(d / "train-labels-idx1-ubyte.gz", rng.integers(0, 10, label_count or n_train).astype(np.uint8))
    ts = test_size or size
    write_idx(d / "t10k-images-idx3-ubyte", rng.integers(0, 255, (n_test, ts, ts), dtype=np.uint8))
    write_idx(d / "t10k-labels-idx1-ubyte", rng.integers(0, 10, n_test).astype(np.uint8))


def test_idx_directory_loads(tmp_path):
    _write_dir(tmp_path)
    ds = load_dataset("idx", str(tmp_path))
    assert len(ds.train) == 20 and len(ds.test) == 10
    x, y = ds.batch(ds.train, np.arange(4))
    assert x.shape == (4, 1, 28, 28) and x.dtype == np.float32 and y.dtype == np.int64


def test_mismatched_label_count(tmp_path):
    _write_dir(tmp_path, label_count=19)
    with pytest.raises(DataError, match="19 labels for 20 images"):
        load_idx_dir(str(tmp_path))


def test_mismatched_image_sizes(tmp_path):
    _write_dir(tmp_path, test_size=32)
    with pytest.raises(DataError, match="differ in size"):
        load_idx_dir(str(tmp_path))


def test_labels_file_in_place_of_images(tmp_path):
    _write_dir(tmp_path)
    (tmp_path / "train-images-idx3-ubyte.gz").write_bytes((tmp_path / "train-labels-idx1-ubyte.gz").read_bytes())
    with pytest.raises(DataError, match="expected images of 3 dimensions"):
        load_idx_dir(str(tmp_path))


def test_missing_directory_and_files(tmp_path):
    with pytest.raises(DataError, match="does not exist"):
        load_dataset("mnist", str(tmp_path / "none"))
    with pytest.raises(DataError, match="missing train-images-idx3-ubyte"):
        load_dataset("mnist", str(tmp_path))
    with pytest.raises(DataError, match="unknown dataset 'cifar'"):
        load_dataset("cifar")


def test_synthetic_is_seeded():
    a, b = synthetic(100, 10, seed=3), synthetic(100, 10, seed=3)
    np.testing.assert_array_equal(a.train.images, b.train.images)
    assert not np.array_equal(a.train.images, synthetic(100, 10, seed=4).train.images)


def test_resize_matches_pytorch_bilinear():
    torch = pytest.importorskip("torch", reason="PyTorch is the reference for resizing")
    x = np.random.default_rng(0).random((3, 28, 28)).astype(np.float32)
    ref = torch.nn.functional.interpolate(torch.from_numpy(x)[:, None], size=(64, 64), mode="bilinear",
                                          align_corners=False)[:, 0].numpy()
    np.testing.assert_allclose(resize(x, 64), ref, atol=1e-5)


def test_shards_partition_the_data():
    n, k = 103, 4
    shards = [shard_indices(n, k, i, seed=1) for i in range(k)]
    allidx = np.concatenate(shards)
    assert sorted(allidx.tolist()) == list(range(n))
    assert [len(s) for s in shards] == shard_sizes(n, [1] * k) == [26, 26, 26, 25]
    np.testing.assert_array_equal(shards[2], shard_indices(n, k, 2, seed=1))


def test_weighted_shards():
    assert shard_sizes(100, [1, 3]) == [25, 75]
    assert sum(shard_sizes(101, [1, 1, 1])) == 101
    with pytest.raises(ValueError, match="positive"):
        shard_sizes(10, [1, 0])


def test_epoch_order_is_a_seeded_permutation():
    idx = np.arange(50)
    a, b = epoch_order(idx, 0, 1, 0), epoch_order(idx, 0, 2, 0)
    assert sorted(a.tolist()) == list(range(50)) and not np.array_equal(a, b)
    np.testing.assert_array_equal(a, epoch_order(idx, 0, 1, 0))
    assert [s.stop - s.start for s in batch_slices(10, 4)] == [4, 4, 2]


def test_bad_samples_are_quarantined_with_a_report(tmp_path):
    from streamnet.training.config import DataConfig
    from streamnet.training.schedule import load_data
    rng = np.random.default_rng(1)
    train = rng.uniform(0, 255, (30, 28, 28)).astype(np.float32)
    train[3, 5, 5] = np.nan
    train[7, 0, 0] = np.inf
    labels = rng.integers(0, 10, 30).astype(np.uint8)
    labels[11] = 200
    write_idx(tmp_path / "train-images-idx3-ubyte", train)
    write_idx(tmp_path / "train-labels-idx1-ubyte", labels)
    write_idx(tmp_path / "t10k-images-idx3-ubyte", rng.integers(0, 255, (10, 28, 28), dtype=np.uint8))
    write_idx(tmp_path / "t10k-labels-idx1-ubyte", rng.integers(0, 10, 10).astype(np.uint8))
    ds = load_data(DataConfig(dataset="mnist", data_dir=str(tmp_path)))
    assert len(ds.train) == 27 and len(ds.test) == 10
    q = ds.quarantined["train"]
    assert q["count"] == 3 and q["non-finite"]["first"] == [3, 7] and q["label out of range"]["first"] == [11]
    assert "test" not in ds.quarantined
    x, y = ds.batch(ds.train, np.arange(27))
    assert np.isfinite(x).all() and y.max() < 10
    kept = np.delete(np.arange(30), [3, 7, 11])
    np.testing.assert_array_equal(y, labels[kept])


def test_tasks_preparing_at_once_share_one_copy_of_the_dataset():
    # the local cluster prepares every worker's tasks on their own threads at once
    from concurrent.futures import ThreadPoolExecutor
    from streamnet.training import DataConfig, lenet5_mixbp
    from streamnet.training.schedule import _dataset, dataset_for
    cfg = lenet5_mixbp(units=8, data=DataConfig(dataset="synthetic", synthetic_train=4096, synthetic_test=64))
    _dataset.cache_clear()
    with ThreadPoolExecutor(8) as pool:
        copies = list(pool.map(lambda _: dataset_for(cfg), range(8)))
    assert all(c is copies[0] for c in copies)
    assert _dataset.cache_info().misses == 1
