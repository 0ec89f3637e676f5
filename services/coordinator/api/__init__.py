"""The coordinator's REST API (FastAPI): app factory, one router per resource."""
