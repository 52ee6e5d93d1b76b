"""A module that takes SLOW_IMPORT_SECONDS (default 2) to import: the heavy
imports (transformers, a tokenizer, a dataset library) of a real training
script, for the spares benchmark."""
import os
import time

time.sleep(float(os.environ.get("SLOW_IMPORT_SECONDS", "2")))
