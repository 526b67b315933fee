"""Megatron's start-up noise, reduced to one line unless UFP4_SHOW_WARNINGS=1.

Importing megatron.core without Apex, TransformerEngine or absl issues half a dozen
UserWarnings ("... not installed. Falling back to ..."), building a GPTModel logs
"GPTModel IS DEPRECATED", and TransformerConfig warns about its own default cuda-graph scope.
None of it is actionable here (the trainer uses Megatron's local spec and torch fallbacks by
design). `hide_megatron_noise()` drops exactly those, when issued from Megatron's own modules:
warnings through `warnings.filterwarnings` (ignore filters keyed on the message and the
issuing module, so `-W`/PYTHONWARNINGS and every other warning keep Python's own handling) and
log records through a logging filter on the root's handlers. One note says so (the trainer
prints it where it imports Megatron, after the config checks, so a refusal stays one line).
Megatron's INFO chatter (dataset index loading, FSDP detection) is turned
off in any case. Any other value of UFP4_SHOW_WARNINGS than 0, 1 or empty is refused (the
trainer: `error: ...`, exit 2).
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
_NOISE = r"not installed|falling back|deprecated|is experimental|not a leaf Tensor"
# Megatron's modules, and cpu_compat's torch function mode, through which Megatron's calls
# pass on CPU (its frame is then the one a warning names)
_MEGATRON_MODULES = r"(megatron|ufp4_megatron\.megatron)\."
# torch's notice that collectives Megatron (and the plugin's TP linears) call were renamed
_TORCH_RENAMES = r"`torch\.distributed\.\w+` is deprecated"
NOTE = (
    f"note: Megatron's warnings about missing Apex/TransformerEngine/absl and its "
    f"deprecation notices are hidden; {SHOW_ENV}=1 shows them"
)

_NOISE_RE = re.compile(_NOISE, re.IGNORECASE)
_TORCH_RENAMES_RE = re.compile(_TORCH_RENAMES)


def _is_noise(message: str, filename: str) -> bool:
    """A log record's test (a record names its file, not its module)."""
    if f"{os.sep}megatron{os.sep}" in filename and _NOISE_RE.search(message):
        return True
    return filename.endswith("c10d_logger.py") and bool(_TORCH_RENAMES_RE.search(message))


class _MegatronLogNoise(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not _is_noise(record.getMessage(), record.pathname)


_log_filter: _MegatronLogNoise | None = None


def _show_all() -> bool:
    value = os.environ.get(SHOW_ENV, "")
    if value not in ("", "0", "1"):  # a typo would otherwise pick one silently
        from ..validate import ConfigError

        raise ConfigError(
            f"{SHOW_ENV}={value!r}: give 1 (show Megatron's start-up warnings) or "
            "0 (hide them behind one note, the default)"
        )
    return value == "1"


_noted = False


def say_hidden() -> None:
    """Prints the note once (rank 0), if the filters are in place."""
    global _noted
    if _log_filter is not None and not _noted:
        _noted = True
        if os.environ.get("RANK", "0") == "0":
            print(NOTE, file=sys.stderr, flush=True)


def hide_megatron_noise(say: bool = True) -> None:
    """Installs the filters (idempotent). Call after logging is configured (Hydra configures it
    when a job starts) and before Megatron is imported. `say`: print the note now; the trainer
    says it later, where it imports Megatron, so that a refused config stays one line."""
    global _log_filter
    logging.getLogger("megatron").setLevel(logging.WARNING)  # dataset-index and FSDP chatter
    if _show_all():
        return
    if _log_filter is None:
        _log_filter = _MegatronLogNoise()
        # a filter's message regex matches from the start of the message, case-insensitively
        warnings.filterwarnings("ignore", message=f".*({_NOISE})", module=_MEGATRON_MODULES)
        warnings.filterwarnings(
            "ignore", message=f".*{_TORCH_RENAMES}", module=r"torch\.distributed\.c10d_logger"
        )
    if say:
        say_hidden()
    # Megatron's module loggers propagate to the root's handlers: filter there.
    for handler in logging.getLogger().handlers:
        if _log_filter not in handler.filters:
            handler.addFilter(_log_filter)
