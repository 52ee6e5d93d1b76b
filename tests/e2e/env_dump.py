"""Writes the worker's environment, minus what the launcher inherited, to
$DUMP_DIR/<RANK>.json (files, because torchrun's workers share its stdout
and their lines can interleave).

BASE_ENV_KEYS (comma-separated) names the variables to leave out: the test
sets it to the launcher's own environment.
"""
import json
import os

base = set(os.environ.get("BASE_ENV_KEYS", "").split(","))
base |= {"BASE_ENV_KEYS", "DUMP_DIR"}
with open(os.path.join(os.environ["DUMP_DIR"], os.environ["RANK"] + ".json"),
          "w") as f:
    json.dump({k: v for k, v in sorted(os.environ.items()) if k not in base},
              f)
