"""Callbacks beside the launcher, imported by its env generator as ROCKET-3's env imports ``rocket_callbacks``.

Every env that builds one writes its process id into ``imported_by/``, next to this file, which is how the test
sees that env processes imported this module.
"""

import os
from pathlib import Path

from craftrl.envs.crafter import CrafterCallback


class ImportedHereCallback(CrafterCallback):
    def __init__(self):
        marks = Path(__file__).resolve().with_name("imported_by")
        marks.mkdir(exist_ok=True)
        (marks / str(os.getpid())).touch()
