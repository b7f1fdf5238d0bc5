"""The zygote (main.py), the supervisor's handle on it (process.py) and the wire between them (messages.py)."""
