"""Predictions for GPUs not measured: a measured step's kernel classes scaled by the resource
that bounds each one (docs/predict.md). Data only: nothing here imports torch."""
