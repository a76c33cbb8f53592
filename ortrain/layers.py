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
    Permute,
    Reshape,
    UpSampling2D,
)
from ortrain.nn.symbolic import Input

# Keras' longer names for the same layers
AveragePooling2D = AvgPool2D
BatchNormalization = BatchNorm
GlobalAveragePooling2D = GlobalAvgPool2D
LayerNormalization = LayerNorm
MaxPooling2D = MaxPool2D

__all__ = ["Activation", "Add", "AveragePooling2D", "AvgPool2D", "BatchNorm", "BatchNormalization", "Concatenate",
           "Conv2D", "Conv2DTranspose", "Dense", "Dropout", "Embedding", "Flatten", "GlobalAvgPool2D",
           "GlobalAveragePooling2D", "Input", "Layer", "LayerNorm", "LayerNormalization", "MaxPool2D", "MaxPooling2D",
           "Permute", "Reshape", "UpSampling2D"]
