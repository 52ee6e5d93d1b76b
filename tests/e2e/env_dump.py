"""Prints the worker's environment, minus what the launcher inherited.

BASE_ENV_KEYS (comma-separated) names the variables to leave out: the
test sets it to the launcher's own environment. Output: one JSON line.
"""
import json
import os

base = set(os.environ.get("BASE_ENV_KEYS", "").split(","))
print(json.dumps({k: v for k, v in sorted(os.environ.items())
                  if k not in base and k != "BASE_ENV_KEYS"}), flush=True)
