"""A study's grid: arms (recipes, named ablations) x axes (e.g. depth) x seeds -> runs.

A grid is a YAML file (`ufp4_megatron/configs/study/<name>.yaml`, or any path) whose keys are
the fields of `StudyGrid`. Every run of a grid shares `overrides`; an arm adds the precision
overrides that name it, an axis value adds its own (one value per axis), the seed sets
`train.seed`. Runs with the same seed see the same initial weights and the same batches in the
same order, whatever the arm: the pairing the loss-gap confidence intervals rely on.

Runs are listed seed by seed (every arm of seed 1, then of seed 2, ...), so a study stopped
early, or cut by a time limit, has whole seeds to compare rather than many half seeds.
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass, field
from pathlib import Path

from ..configs import CONFIG_DIR
from ..train.precision import ABLATION_OVERRIDES as ABLATIONS

GRID_DIR = Path(CONFIG_DIR) / "study"

# Ablations of the E2M1 baseline (paper, Section "Ablation"): RHT16 on all
# three GEMMs (the mechanism predicts it is the worst: RHT moves values into E2M1's asymmetric
# bins), and E2M1 capped to its uniform part {0, 0.5, 1, 1.5, 2} (a 5-level codebook grid).
E2M1_ABLATIONS: dict[str, tuple[str, ...]] = {
    "e2m1_rht_all": ("precision.rht.fprop=true", "precision.rht.dgrad=true"),
    "e2m1_uniform": ("+precision.overrides.grid=[0,0.5,1,1.5,2]",),
}

# Overrides the runner sets itself: a grid or the command line may not.
RUNNER_KEYS = (
    "hydra.run.dir",
    "checkpoint.dir",
    "data.cache_dir",
    "train.seed",
    "precision",
    "experiment",
)


@dataclass(kw_only=True)
class StudyGrid:
    """The YAML schema of a study grid (keys equal these field names)."""

    name: str  # the study's label: W&B group of its runs (`experiment=`)
    arms: list[str]  # precision configs (bf16, e2m1, ufp4, ...) or named ablations
    seeds: list[int]  # `--seeds` replaces them
    overrides: list[str] = field(default_factory=list)  # Hydra overrides of every run
    # axis -> value label -> overrides, e.g. depth: {L4: [model.num_layers=4, model.name=...]}
    axes: dict[str, dict[str, list[str]]] = field(default_factory=dict)
    # name -> overrides of arms defined in the grid itself (precision=... included)
    custom_arms: dict[str, list[str]] = field(default_factory=dict)
    # arm -> that arm's own seeds, in place of `seeds` (e.g. a design with BF16 at 12 seeds
    # beside E2M1 and UFP4 at 28); a grid with arm_seeds fixes its seeds: no --seeds
    arm_seeds: dict[str, list[int]] = field(default_factory=dict)
    reference: str = "bf16"  # the arm every gap is relative to
    baseline: str = "e2m1"  # the arm whose gap the others are divided by
    last_frac: float = 0.2  # the mean gap is over the latest last_frac of the steps


@dataclass(frozen=True)
class RunSpec:
    name: str  # <arm>[-<axis value>...]-s<seed>: its run dir is <study>/runs/<name>
    arm: str
    seed: int
    axis: dict[str, str]  # axis -> value label
    overrides: tuple[str, ...]  # everything that defines the run (not where it is written)


def grid_names() -> list[str]:
    return sorted(p.stem for p in GRID_DIR.glob("*.yaml"))


def load_grid(name_or_path: str) -> StudyGrid:
    """A grid by name (configs/study/<name>.yaml) or path; a bad key fails naming it."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    path = Path(name_or_path)
    if not path.is_file():
        path = GRID_DIR / f"{name_or_path}.yaml"
    if not path.is_file():
        raise SystemExit(
            f"ufp4-launch study: no grid {name_or_path!r}; give a YAML path or one "
            f"of: {', '.join(grid_names())}"
        )
    try:
        node = OmegaConf.merge(OmegaConf.structured(StudyGrid), OmegaConf.load(path))
        grid = OmegaConf.to_object(node)
    except OmegaConfBaseException as e:
        raise SystemExit(f"ufp4-launch study: grid {path}: {str(e).splitlines()[0]}") from None
    check_grid(grid)
    return grid


def parse_seeds(spec: str) -> list[int]:
    """'1-8' -> 1..8, '1,3,5' -> those, '1-4,9' -> both (each seed once, in order)."""
    seeds: list[int] = []
    for part in spec.split(","):
        m = re.fullmatch(r"\s*(\d+)\s*(?:-\s*(\d+)\s*)?", part)
        if not m or (m[2] is not None and int(m[2]) < int(m[1])):
            raise SystemExit(
                f"ufp4-launch study: --seeds {spec!r}: write seeds as 1-8, 1,3,5 "
                f"or 1-4,9 (non-negative integers, ranges low-high)"
            )
        for s in range(int(m[1]), int(m[2] or m[1]) + 1):
            if s not in seeds:
                seeds.append(s)
    return seeds


def select_axis_values(grid: StudyGrid, spec: str) -> None:
    """`--axis NAME=V1,V2`: keep only those values of one axis of the grid (in the grid's
    order), e.g. the cheap depths first; a name or value the grid lacks fails naming it."""
    name, sep, values = spec.partition("=")
    wanted = [v.strip() for v in values.split(",") if v.strip()]
    if not sep or not name.strip() or not wanted:
        raise SystemExit(
            f"ufp4-launch study: --axis {spec!r}: write NAME=VALUE[,VALUE...], e.g. depth=L3,L12"
        )
    name = name.strip()
    if name not in grid.axes:
        have = ", ".join(grid.axes) or "none"
        raise SystemExit(
            f"ufp4-launch study: --axis {spec!r}: the grid has no axis {name!r} (its axes: {have})"
        )
    unknown = [v for v in wanted if v not in grid.axes[name]]
    if unknown:
        raise SystemExit(
            f"ufp4-launch study: --axis {spec!r}: {name} has no value "
            f"{', '.join(map(repr, unknown))} (its values: "
            f"{', '.join(grid.axes[name])})"
        )
    grid.axes[name] = {k: v for k, v in grid.axes[name].items() if k in wanted}


def known_arms(grid: StudyGrid | None = None) -> list[str]:
    precisions = sorted(p.stem for p in (Path(CONFIG_DIR) / "precision").glob("*.yaml"))
    custom = list(grid.custom_arms) if grid else []
    return [*precisions, *ABLATIONS, *E2M1_ABLATIONS, *custom]


def arm_overrides(arm: str, grid: StudyGrid) -> tuple[str, ...]:
    """The precision overrides of one arm; `precision.name` labels it in reports."""
    if arm in grid.custom_arms:
        return tuple(grid.custom_arms[arm])
    if arm in ABLATIONS:  # the UFP4 ablations beside the presets (quant/recipe.py)
        return ("precision=ufp4", f"precision.name={arm}", *ABLATIONS[arm])
    if arm in E2M1_ABLATIONS:
        return ("precision=e2m1", f"precision.name={arm}", *E2M1_ABLATIONS[arm])
    if (Path(CONFIG_DIR) / "precision" / f"{arm}.yaml").is_file():
        return (f"precision={arm}",)
    raise SystemExit(
        f"ufp4-launch study: unknown arm {arm!r}; valid: "
        f"{', '.join(known_arms(grid))} (or define it under custom_arms)"
    )


def check_grid(grid: StudyGrid) -> None:
    def fail(msg: str):
        raise SystemExit(f"ufp4-launch study: grid {grid.name!r}: {msg}")

    if not grid.arms:
        fail("no arms; list recipes or ablations under `arms`")
    if len(set(grid.arms)) != len(grid.arms):
        fail(f"arms repeat: {grid.arms}")
    if not grid.seeds:
        fail("no seeds; list them under `seeds` or pass --seeds")
    if grid.reference not in grid.arms:
        fail(
            f"reference {grid.reference!r} is not among the arms {grid.arms}; every gap is "
            f"measured against it: add it (e.g. --arms {','.join([grid.reference, *grid.arms])}; "
            f"its runs complete on disk are not trained again)"
        )
    if not 0 < grid.last_frac <= 1:
        fail(f"last_frac={grid.last_frac} must be in (0, 1]")
    for o in grid.overrides:
        key = o.lstrip("+~").split("=", 1)[0]
        if key in RUNNER_KEYS:
            fail(
                f"override {o!r} sets {key}, which the runner sets for each run (arms set "
                f"precision, seeds set train.seed); remove it"
            )
    for axis, values in grid.axes.items():
        if not values:
            fail(f"axis {axis!r} has no values")
    for arm in grid.arms:
        arm_overrides(arm, grid)
    for arm, seeds in grid.arm_seeds.items():
        arm_overrides(arm, grid)  # a misspelt arm fails naming the valid ones
        if not seeds or len(set(seeds)) != len(seeds) or min(seeds) < 0:
            fail(f"arm_seeds of {arm}: {seeds}; give distinct non-negative seeds")


def seeds_of(grid: StudyGrid, arm: str) -> list[int]:
    """The seeds an arm trains: its arm_seeds, else the grid's seeds."""
    return list(grid.arm_seeds.get(arm, grid.seeds))


def expand(grid: StudyGrid) -> list[RunSpec]:
    """Seed-major: all arms x axis values of the first seed, then the next seed (an arm with
    arm_seeds only at its own seeds)."""
    axes = list(grid.axes.items())
    combos = list(itertools.product(*[list(values.items()) for _, values in axes]))
    runs = []
    extra = sorted({s for arm in grid.arms for s in seeds_of(grid, arm)} - set(grid.seeds))
    for seed in [*grid.seeds, *extra]:
        for combo in combos:
            for arm in grid.arms:
                if seed not in seeds_of(grid, arm):
                    continue
                labels = {axis: label for (axis, _), (label, _) in zip(axes, combo)}
                axis_overrides = [o for _, overrides in combo for o in overrides]
                name = "-".join([arm, *labels.values(), f"s{seed}"])
                runs.append(
                    RunSpec(
                        name=name,
                        arm=arm,
                        seed=seed,
                        axis=labels,
                        overrides=(
                            *grid.overrides,
                            *axis_overrides,
                            *arm_overrides(arm, grid),
                            f"train.seed={seed}",
                        ),
                    )
                )
    return runs
