"""Megatron's start-up noise, reduced to one line unless UFP4_SHOW_WARNINGS=1.

Importing megatron.core without Apex, TransformerEngine or absl issues half a dozen
UserWarnings ("... not installed. Falling back to ..."), building a GPTModel logs
"GPTModel IS DEPRECATED", and TransformerConfig warns about its own default cuda-graph scope.
None of it is actionable here (the trainer uses Megatron's local spec and torch fallbacks by
design). `hide_megatron_noise()` drops exactly those, when issued from Megatron's own files,
and prints one note the first time it hides one; every other warning still shows. Megatron's
INFO chatter (dataset index loading, FSDP detection) is turned off in any case.
"""
from __future__ import annotations

import logging
import os
import re
import sys
import warnings

SHOW_ENV = "UFP4_SHOW_WARNINGS"
# "<X> is not installed", "Falling back to ...", "... is deprecated", "... is experimental",
# and the distributed optimizer's zero_grad reading .grad of its non-leaf shard views
_NOISE = re.compile(r"not installed|falling back|deprecated|is experimental|not a leaf Tensor",
                    re.IGNORECASE)
# torch's notice that collectives Megatron (and the plugin's TP linears) call were renamed
_TORCH_RENAMES = re.compile(r"`torch\.distributed\.\w+` is deprecated")
NOTE = (f"note: Megatron's warnings about missing Apex/TransformerEngine/absl and its "
        f"deprecation notices are hidden; {SHOW_ENV}=1 shows them")


def _is_noise(message: str, filename: str) -> bool:
    # Megatron's own files, and cpu_compat's torch function mode, through which Megatron's
    # calls pass on CPU (its frame is then the one a warning names)
    if f"{os.sep}megatron{os.sep}" in filename and _NOISE.search(message):
        return True
    return filename.endswith("c10d_logger.py") and bool(_TORCH_RENAMES.search(message))


class _Hider(logging.Filter):
    """A warnings.showwarning replacement and a logging filter, counting what it hides."""

    def __init__(self, show):
        super().__init__()
        self.hidden = 0
        self._show = show

    def _hide(self) -> None:
        if self.hidden == 0 and os.environ.get("RANK", "0") == "0":
            print(NOTE, file=sys.stderr, flush=True)
        self.hidden += 1

    def showwarning(self, message, category, filename, lineno, file=None, line=None):
        if _is_noise(str(message), str(filename)):
            return self._hide()
        return self._show(message, category, filename, lineno, file, line)

    def filter(self, record: logging.LogRecord) -> bool:
        if _is_noise(record.getMessage(), record.pathname):
            self._hide()
            return False
        return True


_hider: _Hider | None = None


def hide_megatron_noise() -> None:
    """Installs the filter (idempotent). Call after logging is configured (Hydra configures it
    when a job starts) and before Megatron is imported."""
    global _hider
    logging.getLogger("megatron").setLevel(logging.WARNING)  # dataset-index and FSDP chatter
    if os.environ.get(SHOW_ENV, "") not in ("", "0"):
        return
    if _hider is None:
        _hider = _Hider(warnings.showwarning)
        warnings.showwarning = _hider.showwarning
    # Megatron's module loggers propagate to the root's handlers: filter there.
    for handler in logging.getLogger().handlers:
        if _hider not in handler.filters:
            handler.addFilter(_hider)
