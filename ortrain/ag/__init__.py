"""Tensor tracing: write a loss or a whole step with ag ops, run it as ONNX graphs.

>>> import numpy as np, ortrain as ot
>>> from ortrain import ag
>>> W = ag.param(np.full((2, 3), 0.1, np.float32), name="W")
>>> opt = ot.optim.Adam([W], lr=1e-2)
>>> train = ot.capture_step(lambda x, y: ag.mse_loss(ag.matmul(W, x), y), optimizer=opt)
>>> loss = train(x=np.ones((3, 4), np.float32), y=np.zeros((2, 4), np.float32))
>>> round(float(loss), 4), opt.step
(0.09, 1)
>>> train.free()

Ops record a graph (shapes are checked as they are called); ``ot.capture_step`` and
``ot.capture`` trace ``fn`` once and then run the recorded graphs on every call.
"""

from ortrain.ag.losses import (
    bce_with_logits_loss,
    cross_entropy_loss,
    huber_loss,
    mse_loss,
    softmax_cross_entropy_loss,
)
from ortrain.ag.ops import (
    abs,
    add,
    concat,
    div,
    dropout,
    exp,
    gelu,
    get_rows,
    linear,
    log,
    log_softmax,
    matmul,
    mean,
    mul,
    neg,
    pow,
    relu,
    reshape,
    scale,
    sigmoid,
    softmax,
    sqrt,
    square,
    sub,
    sum,
    tanh,
    transpose,
)
from ortrain.ag.tensor import Buffer, Param, Tensor, buffer, param

__all__ = [
    "Buffer", "Param", "Tensor", "abs", "add", "bce_with_logits_loss", "buffer", "concat", "cross_entropy_loss",
    "div", "dropout", "exp", "gelu", "get_rows", "huber_loss", "linear", "log", "log_softmax", "matmul", "mean",
    "mse_loss", "mul", "neg", "param", "pow", "relu", "reshape", "scale", "sigmoid", "softmax",
    "softmax_cross_entropy_loss", "sqrt", "square", "sub", "sum", "tanh", "transpose",
]


def _name_unknown_arguments() -> None:
    import inspect

    from ortrain._keywords import names_unknown_arguments_of
    for name in __all__:
        fn = globals()[name]
        if inspect.isfunction(fn):  # ag.mean(x, axes=1) names the argument and what mean takes
            wrapped = globals()[name] = names_unknown_arguments_of(fn, label=f"ag.{name}")
            wrapped.__module__ = __name__  # pickle finds it here (its own module keeps the function unwrapped)


_name_unknown_arguments()
