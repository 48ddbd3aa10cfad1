"""The FastAPI server: admin page, admin JSON API, agent protocol."""
