"""Config values that become path components of the run dir, checked before anything is made.

The default run dir is `runs/${experiment}/${model.name}-${precision.name}-s${seed}-<id>`
(configs/hydra/default.yaml): a separator or `..` in one of these names would put the run,
its checkpoints and its config outside `runs/` (`experiment=../../x`). Each must be one path
component: not empty, no `/` or `\\`, not `.` or `..`, no control characters, short enough for
a file name. `hydra.run.dir` is a path by design, but an empty one would train into the
current directory: refused too.
"""

from __future__ import annotations

NAMED = ("experiment", "model.name", "precision.name")
_MAX = 100  # the run dir's name joins two of them with the seed and id; file names stop at 255


def name_problem(key: str, value) -> str | None:
    """One line saying why `value` cannot be `key` (a path component), or None."""
    v = "" if value is None else str(value)
    what = None
    if not v.strip():
        what = "is empty"
    elif "/" in v or "\\" in v:
        what = "contains a path separator"
    elif v in (".", ".."):
        what = "is a relative directory"
    elif any(ord(c) < 32 or ord(c) == 127 for c in v):
        what = "contains a control character"
    elif len(v) > _MAX:
        what = f"is {len(v)} characters long (at most {_MAX})"
    if what is None:
        return None
    return (
        f"{key}={v!r} {what}; it names a directory of the run dir (runs/<experiment>/"
        "<model.name>-<precision.name>-...), so it must be one plain name, e.g. "
        f"{key}=my_{key.split('.')[0]}"
    )


def run_dir_problem(value) -> str | None:
    if value is None or not str(value).strip():
        return (
            "hydra.run.dir is empty, which would train into the current directory; give "
            "a directory (hydra.run.dir=runs/my_run), or drop it for the default under runs/"
        )
    return None


def config_problem(cfg) -> str | None:
    """The first problem of the composed config's names (a dataclass or DictConfig)."""
    for key in NAMED:
        node = cfg
        for part in key.split("."):
            node = getattr(node, part, None)
        if (problem := name_problem(key, node)) is not None:
            return problem
    return None


def overrides_problem(overrides: list[str]) -> str | None:
    """The same checks on the command line's overrides, before Hydra makes the run dir."""
    for o in overrides:
        key, sep, value = o.lstrip("+~").partition("=")
        if not sep:
            continue
        if key in NAMED and (problem := name_problem(key, value.strip("'\""))):
            return problem
        if key == "hydra.run.dir" and (problem := run_dir_problem(value.strip("'\""))):
            return problem
    return None
