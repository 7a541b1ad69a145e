"""numba kernels over plain arrays: no classes with hidden state, no I/O, no logging.

Every function is `njit(cache=True, nogil=True)`; forward passes return what
their backward pass needs, and backward passes write parameter gradients into
caller-owned views (slices of one flat gradient vector). Their matrix products run
on the newest OpenBLAS installed (`_blas.py`), chosen here before the first one.
"""
from . import _blas

_blas.use()

from .activations import (relu_backward, relu_forward, sigmoid_backward, sigmoid_forward,
                          tanh_backward, tanh_forward)
from .conv import (columns_size, conv2d_backward, conv2d_backward_kept, conv2d_forward,
                   conv2d_forward_keep, conv2d_pool_backward, conv2d_pool_forward, conv_out_size)
from .conv_wide import use_wide_pool, wide_pool_backward, wide_pool_forward
from .dense import dense_backward, dense_forward, dense_relu_backward, dense_relu_forward
from .dropout import dropout_backward, dropout_forward, dropout_mask
from .loss import argmax_rows, softmax_cross_entropy
from .lrn import lrn_backward, lrn_forward
from .optim import all_finite, sgd_step, weighted_average, weighted_sum_rows
from .pool import (avgpool_backward, avgpool_forward, maxpool_backward, maxpool_forward,
                   pool_out_size)

__all__ = [name for name in dir() if not name.startswith("_")]
