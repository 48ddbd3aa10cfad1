"""The backend types as the config names them: each one's settings (models.py). Their executors are executors/."""
