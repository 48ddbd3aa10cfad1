"""Trainer registry: hf-text-classification, sklearn-text, decision-calibrate."""
