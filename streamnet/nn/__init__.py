"""Layers and models (LeNet-5, AlexNet) over one flat float32 parameter vector."""
from .layers import (LRN, AvgPool2d, Conv2d, Dense, Dropout, Flatten, Layer, MaxPool2d, ReLU,
                     Sigmoid, Tanh, layer_from_spec)
from .model import Model
from .parallel import ParallelStep
from .zoo import MODELS, alexnet, build_model, lenet5

__all__ = ["Model", "ParallelStep", "lenet5", "alexnet", "build_model", "MODELS", "Layer", "Conv2d", "Dense",
           "MaxPool2d", "AvgPool2d", "ReLU", "Tanh", "Sigmoid", "LRN", "Dropout", "Flatten",
           "layer_from_spec"]
