"""Optimizers (``Adam``, ``AdamW``, ``SGD``) and learning-rate schedules."""

from ortrain.optim import schedules
from ortrain.optim.optimizers import SGD, Adam, AdamW, Optimizer, check_lr, check_weight_decay, get

__all__ = ["SGD", "Adam", "AdamW", "Optimizer", "check_lr", "check_weight_decay", "get", "schedules"]
