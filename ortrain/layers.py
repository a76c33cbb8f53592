"""``ot.layers``: the Keras-style layers."""

from ortrain.nn.layers import (
    Activation,
    Add,
    AvgPool2D,
    BatchNorm,
    Concatenate,
    Conv2D,
    Conv2DTranspose,
    Dense,
    Dropout,
    Embedding,
    Flatten,
    GlobalAvgPool2D,
    Layer,
    LayerNorm,
    MaxPool2D,
    Reshape,
    UpSampling2D,
)

__all__ = ["Activation", "Add", "AvgPool2D", "BatchNorm", "Concatenate", "Conv2D", "Conv2DTranspose", "Dense",
           "Dropout", "Embedding", "Flatten", "GlobalAvgPool2D", "Layer", "LayerNorm", "MaxPool2D", "Reshape",
           "UpSampling2D"]
