"""Callbacks for ``fit`` and ``fit_generator``: one class per file.

>>> import ortrain as ot
>>> stop = ot.callbacks.EarlyStopping(monitor="val_loss", patience=2, restore_best_weights=True)
>>> sorted(n for n in ot.callbacks.__all__ if n.endswith("Decay"))
['CosineDecay', 'StepDecay']
"""

from ortrain.callbacks.base import Callback, CallbackList
from ortrain.callbacks.cosine_decay import CosineDecay
from ortrain.callbacks.csv_logger import CSVLogger
from ortrain.callbacks.early_stopping import EarlyStopping
from ortrain.callbacks.lambda_callback import LambdaCallback
from ortrain.callbacks.learning_rate_scheduler import LearningRateScheduler
from ortrain.callbacks.model_checkpoint import ModelCheckpoint
from ortrain.callbacks.progress import ProgressBar, ProgressLines
from ortrain.callbacks.reduce_lr_on_plateau import ReduceLROnPlateau
from ortrain.callbacks.step_decay import StepDecay
from ortrain.callbacks.terminate_on_nan import TerminateOnNaN

__all__ = [
    "CSVLogger",
    "Callback",
    "CallbackList",
    "CosineDecay",
    "EarlyStopping",
    "LambdaCallback",
    "LearningRateScheduler",
    "ModelCheckpoint",
    "ProgressBar",
    "ProgressLines",
    "ReduceLROnPlateau",
    "StepDecay",
    "TerminateOnNaN",
]


def _name_unknown_arguments() -> None:
    from ortrain._keywords import name_unknown_arguments
    for name in __all__:
        if name not in ("Callback", "CallbackList"):  # subclassed by users, with their own arguments
            name_unknown_arguments(globals()[name])  # Keras' arguments ported as written get the fix


_name_unknown_arguments()
