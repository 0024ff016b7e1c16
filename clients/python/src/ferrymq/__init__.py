"""FerryMQ client for Python."""
