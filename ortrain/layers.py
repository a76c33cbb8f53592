"""``ot.layers``: the Keras-style layers."""

from ortrain.nn.layers import (
    Activation,
    Add,
    AvgPool2D,
    BatchNorm,
    Concatenate,
    Conv2D,
    Dense,
    Dropout,
    Embedding,
    Flatten,
    GlobalAvgPool2D,
    Layer,
    LayerNorm,
    MaxPool2D,
    Reshape,
)

__all__ = ["Activation", "Add", "AvgPool2D", "BatchNorm", "Concatenate", "Conv2D", "Dense", "Dropout",
           "Embedding", "Flatten", "GlobalAvgPool2D", "Layer", "LayerNorm", "MaxPool2D", "Reshape"]
