"""Thin Celery tasks that call the service layer (runs.py, retrain.py)."""
