"""IDX reader, datasets, shards and batches."""
from .datasets import Dataset, Split, load_dataset, load_idx_dir, resize, synthetic, to_input
from .idx import parse_idx, read_idx, write_idx
from .shards import batch_slices, epoch_order, shard_indices, shard_sizes

__all__ = ["read_idx", "parse_idx", "write_idx", "Dataset", "Split", "load_dataset", "load_idx_dir",
           "synthetic", "resize", "to_input", "shard_indices", "shard_sizes", "epoch_order",
           "batch_slices"]
