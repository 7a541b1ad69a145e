"""Hostile IDX input: gzip bombs, headers whose size overflows, labels that would
size the model. Each is refused (or quarantined) cheaply, with a clear error."""
import gzip
import logging
import tracemalloc

import numpy as np
import pytest

from streamnet.data import idx, parse_idx, read_idx, write_idx
from streamnet.data.datasets import MAX_CLASSES
from streamnet.errors import DataError

GOOD = bytes([0, 0, 8, 2]) + np.array([2, 3], ">u4").tobytes() + bytes(range(6))


def _header(code: int, dims) -> bytes:
    return bytes([0, 0, code, len(dims)]) + np.array(dims, ">u4").tobytes()


def _gz(path, *parts: bytes, repeat: bytes = b"", times: int = 0):
    """A gzip file of the parts then `repeat` `times` over, written a piece at a time
    so that building a bomb costs no more memory than one piece."""
    with gzip.open(path, "wb", compresslevel=9) as f:
        for p in parts:
            f.write(p)
        for _ in range(times):
            f.write(repeat)
    return path


def test_gzip_bomb_is_refused_without_expanding_it(tmp_path):
    # 200 bytes declared, 4 MB of zeros behind them (a 4 KB file); read whole, it peaks near 11 MB
    p = _gz(tmp_path / "bomb.gz", _header(8, [200]), repeat=bytes(64 << 10), times=64)
    assert p.stat().st_size < 64 << 10
    tracemalloc.start()
    try:
        with pytest.raises(DataError) as err:
            read_idx(p)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert str(p) in str(err.value) and "trailing data after dimensions (200,)" in str(err.value)
    assert peak < 2 << 20, f"decompressed {peak} bytes to refuse a file that declares 208"


@pytest.mark.parametrize("values,message", [
    (5, "truncated: dimensions (2, 3) need 18 bytes, decompressed file has 17"),
    (7, "trailing data after dimensions (2, 3): the decompressed file holds more than the 18 bytes"),
])
def test_gzip_size_checks_use_the_declared_size(tmp_path, values, message):
    p = _gz(tmp_path / "a.gz", _header(8, [2, 3]), bytes(values))
    with pytest.raises(DataError) as err:
        read_idx(p)
    assert str(p) in str(err.value) and message in str(err.value)


def test_gzip_integrity_is_still_checked_after_a_bounded_read(tmp_path):
    z = bytearray(gzip.compress(GOOD))
    z[-8] ^= 0xFF   # the CRC-32 in the member's trailer
    (tmp_path / "crc.gz").write_bytes(bytes(z))
    with pytest.raises(DataError, match="corrupt gzip stream"):
        read_idx(tmp_path / "crc.gz")
    (tmp_path / "tail.gz").write_bytes(gzip.compress(GOOD) + b"not gzip")
    with pytest.raises(DataError, match="corrupt gzip stream"):
        read_idx(tmp_path / "tail.gz")
    (tmp_path / "ok.gz").write_bytes(gzip.compress(GOOD))
    np.testing.assert_array_equal(read_idx(tmp_path / "ok.gz"), np.arange(6).reshape(2, 3))


@pytest.mark.parametrize("code,dims", [
    (0x08, [65536] * 4),            # 2**64 values: an int64 product wraps to 0
    (0x0E, [65536, 65536, 65536, 8192]),  # 2**61 values of 8 bytes
    (0x08, [2**32 - 1] * 8),        # about 2**256 values
    (0x0C, [2**31, 2]),             # no overflow, but 16 GiB
])
def test_header_declaring_more_than_the_bound_is_refused(tmp_path, code, dims):
    raw = _header(code, dims)
    for data in (raw, raw + bytes(16)):
        with pytest.raises(DataError, match="an IDX file may hold"):
            parse_idx(data, "h.idx")
        p = tmp_path / "h"
        p.write_bytes(data)
        with pytest.raises(DataError, match="an IDX file may hold") as err:
            read_idx(p)
        assert str(p) in str(err.value)
    with pytest.raises(DataError, match="an IDX file may hold"):
        read_idx(_gz(tmp_path / "h.gz", raw))


def test_the_bound_is_checked_before_reading_the_values(tmp_path, monkeypatch):
    monkeypatch.setattr(idx, "MAX_BYTES", 100)
    write_idx(tmp_path / "at.gz", np.zeros(92, np.uint8))     # 8 + 92 bytes: allowed
    assert read_idx(tmp_path / "at.gz").shape == (92,)
    write_idx(tmp_path / "over.gz", np.zeros(93, np.uint8))
    with pytest.raises(DataError, match=r"dimensions \(93,\) of 1-byte values need 101 bytes, more than the 100"):
        read_idx(tmp_path / "over.gz")


def _label_dir(d, train_labels, test_labels=(0, 1, 2, 3)):
    x = np.zeros((len(train_labels), 8, 8), np.uint8)
    write_idx(d / "train-images-idx3-ubyte", x)
    write_idx(d / "t10k-images-idx3-ubyte", np.zeros((len(test_labels), 8, 8), np.uint8))
    write_idx(d / "train-labels-idx1-ubyte", np.array(train_labels, ">i4"))
    write_idx(d / "t10k-labels-idx1-ubyte", np.array(test_labels, ">i4"))


def _load(d, dataset):
    from streamnet.training.config import DataConfig
    from streamnet.training.schedule import load_data
    return load_data(DataConfig(dataset=dataset, data_dir=str(d)))


def test_a_corrupt_label_does_not_set_the_class_count(tmp_path, caplog):
    _label_dir(tmp_path, [0, 1, 2, 2**31 - 1, 1])
    with caplog.at_level(logging.WARNING):
        ds = _load(tmp_path, "idx")
    assert ds.num_classes == 4    # from the test labels 0..3
    assert len(ds.train) == 4 and ds.quarantined["train"]["label out of range"]["first"] == [3]
    warned = " ".join(r.getMessage() for r in caplog.records)
    assert "train-labels-idx1-ubyte" in warned and "2147483647" in warned


def test_class_count_bound_edges(tmp_path):
    _label_dir(tmp_path, [0, MAX_CLASSES - 1])
    assert _load(tmp_path, "idx").num_classes == MAX_CLASSES
    _label_dir(tmp_path, [0, MAX_CLASSES])
    ds = _load(tmp_path, "idx")
    assert ds.num_classes == 4 and len(ds.train) == 1


def test_named_datasets_quarantine_labels_outside_their_classes(tmp_path):
    _label_dir(tmp_path, [0, 2**31 - 1, -1, 9, 10])
    ds = _load(tmp_path, "mnist")
    assert ds.num_classes == 10
    assert ds.quarantined["train"]["label out of range"]["first"] == [1, 2, 4]
    np.testing.assert_array_equal(ds.train.labels, [0, 9])


@pytest.mark.parametrize("labels, first", [([0.0, 1.0, 3.7, 2.0], "index 2: 3.7"), ([1.0, float("nan")], "index 1")])
def test_a_float_label_file_whose_labels_are_not_whole_numbers_is_refused(tmp_path, labels, first):
    _label_dir(tmp_path, [0] * len(labels))
    write_idx(tmp_path / "train-labels-idx1-ubyte", np.array(labels, ">f4"))     # 3.7 was trained as class 3
    with pytest.raises(DataError, match=f"train-labels-idx1-ubyte: 1 labels are not whole numbers .*{first}"):
        _load(tmp_path, "idx")
    write_idx(tmp_path / "train-labels-idx1-ubyte", np.array([0.0, 1.0, 3.0, 2.0][:len(labels)], ">f4"))
    assert _load(tmp_path, "idx").train.labels.tolist() == [0, 1, 3, 2][:len(labels)]    # whole: fine


def test_a_dataset_with_no_samples_left_to_train_on_is_refused(tmp_path):
    """Every label out of range (mnist's are 0-9): the spout divided by its 0 rounds, or,
    under load balancing, the run ended at once and reported an untrained model."""
    _label_dir(tmp_path, [10, 11, 12])
    with pytest.raises(DataError, match=r"dataset mnist: no train samples \(3 quarantined: "):
        _load(tmp_path, "mnist")
    _label_dir(tmp_path, [], [])
    with pytest.raises(DataError, match=r"dataset idx: no train samples; nothing to train on"):
        _load(tmp_path, "idx")
    _label_dir(tmp_path, [1, 2], [12])
    with pytest.raises(DataError, match=r"dataset mnist: no test samples \(1 quarantined"):
        _load(tmp_path, "mnist")


def test_images_of_no_pixels_are_refused(tmp_path):
    _label_dir(tmp_path, [0, 1])
    write_idx(tmp_path / "train-images-idx3-ubyte", np.zeros((2, 0, 0), np.uint8))    # an IndexError in training
    with pytest.raises(DataError, match="train-images-idx3-ubyte: images must be square, with pixels; got 0x0"):
        _load(tmp_path, "idx")
