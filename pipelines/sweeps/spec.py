"""A sweep's spec (configs x grid settings x seeds), its validation and the readable names of its runs.

A spec is a YAML file or the same on the command line::

    configs:
      - configs/default.yaml
      - configs/actorq/cartpole-dqn.yaml
      - {config: configs/cartpole-vtrace.yaml, name: vtrace-central, seeds: 0-4, set: {inference: central}}
    seeds: 0-9                     # "A-B" (inclusive), "0,3,7", one number, or a YAML list
    grid:                          # every combination of these is one setting
      actors.precision: [fp32, int8-dynamic]
      learner.replay_ratio: [0.5, 0.25]
    set:                           # applied to every run (a mapping, or a list of KEY=VALUE)
      total_env_steps: 40000

A config entry is a path, or a mapping (:class:`ConfigEntry`) that gives it a ``name`` (used in place of
the file's stem in run names and report groups: one file may then appear twice, with different ``set``),
its own ``seeds`` (in place of the spec's) and its own ``set``. A run's overrides apply in the order
threads, the entry's ``set``, the spec's ``set`` (so ``--set`` on the command line wins), the grid's setting.

Every ``(config, setting, seed)`` is one :class:`RunSpec`, named
``<config file stem>__<key>=<value>__...__s<seed>`` (e.g.
``default__actors.precision=int8-dynamic__s3``): characters outside ``[A-Za-z0-9._=+,-]`` become ``-``,
a name longer than :data:`MAX_NAME` is cut and ends in a hash of the whole, and two runs that would share
a name are refused. :func:`check_run_name` is applied to every name read back from a record too, so no
name can point outside the sweep directory.

:func:`validate_runs` builds every run's config with :func:`core.config.load_config` before any run
starts: an unknown config file, key or value is one :class:`core.config.ConfigError` line. ``seed``,
``executor``, ``run_dir`` and ``dask.address`` belong to the sweep and are refused in ``set``/``grid``.

Example::

    spec = SweepSpec(configs=["configs/default.yaml"], seeds=parse_seeds("0-1"),
                     grid={"actors.precision": ["fp32", "int8-dynamic"]}, overrides=["total_env_steps=2048"])
    runs = expand(spec)           # 4 RunSpecs, e.g. runs[0].name == "default__actors.precision=fp32__s0"
    validate_runs(runs)           # ConfigError (one line) on the first bad combination
"""
from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import os
import re
from typing import Any, Dict, List, Optional, Sequence, Union

from core.config import MAX_SEED, ConfigError

#: keys the sweep sets itself, refused in ``set`` and ``grid``
RESERVED_KEYS = ("seed", "executor", "run_dir", "dask.address")
#: overrides every run gets before the spec's own: one TensorFlow intra-op and inter-op thread, one tensorstore
#: shard-encoding thread and one checkpoint-writer thread per run (TF fixes its pools per process; the sweep's
#: parallelism is across runs; shard and checkpoint bytes do not depend on the thread counts). A spec's ``set``
#: may change them.
THREAD_OVERRIDES = ("threads.tf_intra_op=1", "threads.tf_inter_op=1", "replay.write_threads=1",
                    "checkpoint.write_threads=1")
SPEC_KEYS = ("configs", "seeds", "grid", "set")
ENTRY_KEYS = ("config", "name", "seeds", "set")
MAX_NAME = 120
MAX_RUNS = 100_000
_NAME_OK = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._=+,-]*$")


@dataclasses.dataclass
class ConfigEntry:
    """A config file of a sweep with its own ``name``, ``seeds`` and ``set`` (each optional)."""
    config: str
    name: Optional[str] = None
    seeds: Optional[List[int]] = None
    overrides: List[str] = dataclasses.field(default_factory=list)

    def to_dict(self) -> Any:
        if self.name is None and self.seeds is None and not self.overrides:
            return self.config
        data: Dict[str, Any] = {"config": self.config}
        if self.name is not None:
            data["name"] = self.name
        if self.seeds is not None:
            data["seeds"] = list(self.seeds)
        if self.overrides:
            data["set"] = list(self.overrides)
        return data

    @classmethod
    def from_data(cls, data: Any, where: str) -> "ConfigEntry":
        """A path, or a mapping with :data:`ENTRY_KEYS`; ConfigError names what is wrong."""
        if isinstance(data, str) and data:
            return cls(data)
        if not isinstance(data, dict) or not isinstance(data.get("config"), str) or not data["config"]:
            raise ConfigError(f"{where}: a 'configs' entry must be a config file path or a mapping with "
                              f"'config: PATH' (and optional name, seeds, set)")
        unknown = sorted(set(data) - set(ENTRY_KEYS))
        if unknown:
            raise ConfigError(f"{where}: config entry {data['config']!r} has unknown key {unknown[0]!r}; "
                              f"valid keys: {', '.join(ENTRY_KEYS)}")
        name = data.get("name")
        if name is not None and (not isinstance(name, str) or safe_part(name) != name or not name):
            raise ConfigError(f"{where}: config entry name {name!r} is not valid; valid: [A-Za-z0-9._=+,-]")
        seeds = data.get("seeds")
        if seeds is not None:
            seeds = parse_seeds(",".join(str(s) for s in seeds) if isinstance(seeds, list) else str(seeds))
        return cls(data["config"], name, seeds, _set_list(data.get("set"), where))

    @property
    def label(self) -> str:
        """The name of the entry's runs: ``name``, else the config file's stem."""
        return self.name or os.path.splitext(os.path.basename(self.config))[0]


def _set_list(sets: Any, where: str) -> List[str]:
    """A ``set`` (mapping KEY: VALUE, list of KEY=VALUE, or nothing) as a list of KEY=VALUE."""
    sets = sets or []
    if isinstance(sets, dict):
        sets = [f"{k}={value_text(v)}" for k, v in sets.items()]
    if not isinstance(sets, list):
        raise ConfigError(f"{where}: 'set' must be a mapping KEY: VALUE or a list of KEY=VALUE")
    return [str(s) for s in sets]


@dataclasses.dataclass
class SweepSpec:
    configs: List[Union[str, ConfigEntry]]
    seeds: List[int]
    grid: Dict[str, List[str]] = dataclasses.field(default_factory=dict)
    overrides: List[str] = dataclasses.field(default_factory=list)

    def entries(self) -> List[ConfigEntry]:
        """Every config as a :class:`ConfigEntry` (a plain path: no name, the spec's seeds, no own set)."""
        return [c if isinstance(c, ConfigEntry) else ConfigEntry(c) for c in self.configs]

    def to_dict(self) -> Dict[str, Any]:
        return {"configs": [e.to_dict() for e in self.entries()], "seeds": list(self.seeds),
                "grid": {k: list(v) for k, v in self.grid.items()}, "set": list(self.overrides)}

    @classmethod
    def from_dict(cls, data: Any, where: str = "the spec") -> "SweepSpec":
        """A spec from YAML/JSON data (a mapping with :data:`SPEC_KEYS`); ConfigError names what is wrong."""
        if not isinstance(data, dict):
            raise ConfigError(f"{where} must be a mapping with keys {', '.join(SPEC_KEYS)}")
        unknown = sorted(set(data) - set(SPEC_KEYS))
        if unknown:
            raise ConfigError(f"{where}: unknown key {unknown[0]!r}; valid keys: {', '.join(SPEC_KEYS)}")
        configs = data.get("configs")
        if isinstance(configs, str):
            configs = [configs]
        if not configs or not isinstance(configs, list):
            raise ConfigError(f"{where}: 'configs' must be a non-empty list of config file paths")
        entries = [ConfigEntry.from_data(c, where) for c in configs]
        if "seeds" not in data:
            raise ConfigError(f"{where}: 'seeds' is missing; valid: a range such as 0-9, a list, or one seed")
        seeds = data["seeds"]
        seeds = parse_seeds(",".join(str(s) for s in seeds) if isinstance(seeds, list) else str(seeds))
        grid_data = data.get("grid") or {}
        if not isinstance(grid_data, dict):
            raise ConfigError(f"{where}: 'grid' must map KEY to a list of values")
        grid = {str(k): [value_text(v) for v in (vs if isinstance(vs, list) else [vs])]
                for k, vs in grid_data.items()}
        spec = cls(configs=[e.config if e.to_dict() == e.config else e for e in entries], seeds=seeds, grid=grid,
                   overrides=_set_list(data.get("set"), where))
        check_keys(spec)
        return spec


@dataclasses.dataclass(frozen=True)
class RunSpec:
    """One run of a sweep: its name (= its directory under ``SWEEP_DIR/runs``), config, setting and seed."""
    name: str
    config: str                  # absolute path of the config file
    seed: int
    setting: Dict[str, str]      # the grid's values for this run, key -> value text
    overrides: List[str]         # every --set of this run, in order (threads, the entry's set, the spec's, the setting)
    group: Optional[str] = None  # the config entry's name (None: the config file's stem)

    @property
    def label(self) -> str:
        """The run's config group: its entry's name, else the config file's stem."""
        return self.group or os.path.splitext(os.path.basename(self.config))[0]

    def train_args(self, run_dir: str) -> List[str]:
        """``pipelines.train`` arguments (after ``python -m pipelines.train``) of a fresh start of this run."""
        args = ["--config", self.config, "--seed", str(self.seed)]
        for o in self.overrides:
            args += ["--set", o]
        return args + ["--run-dir", run_dir, "--executor", "local", "--no-progress"]

    def to_dict(self) -> Dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Dict[str, Any]) -> "RunSpec":
        try:
            run = cls(name=check_run_name(data["name"]), config=str(data["config"]), seed=int(data["seed"]),
                      setting={str(k): str(v) for k, v in dict(data["setting"]).items()},
                      overrides=[str(o) for o in data["overrides"]],
                      group=None if data.get("group") is None else str(data["group"]))
        except (KeyError, TypeError, ValueError) as e:
            raise ConfigError(f"a run record is malformed ({type(e).__name__}: {e})") from None
        return run


def read_spec_data(path: str) -> Dict[str, Any]:
    """The mapping in a YAML spec file; ConfigError (one line) if it is missing, not YAML or not a mapping."""
    import yaml
    if not os.path.isfile(path):
        raise ConfigError(f"spec file {path!r} does not exist; valid: a YAML file (python -m pipelines.sweep --help)")
    try:
        with open(path) as f:
            data = yaml.safe_load(f) or {}
    except yaml.YAMLError:
        raise ConfigError(f"spec file {path!r} is not valid YAML") from None
    if not isinstance(data, dict):
        raise ConfigError(f"spec file {path!r} must be a mapping ({', '.join(SPEC_KEYS)})")
    return data


def read_spec(path: str) -> SweepSpec:
    """The :class:`SweepSpec` of a YAML spec file (ConfigError, one line, on anything wrong)."""
    return SweepSpec.from_dict(read_spec_data(path), where=path)


def value_text(value: Any) -> str:
    """A YAML value as ``--set`` text (parsed back with YAML rules): strings as they are, the rest as JSON."""
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    return json.dumps(value)


def parse_seeds(text: str) -> List[int]:
    """``"0-9"`` -> 0..9 (inclusive), ``"0,3,7"`` -> [0, 3, 7], ``"4"`` -> [4]; ConfigError on anything else."""
    valid = "valid: A-B (inclusive, A <= B), a comma-separated list such as 0,3,7, or one seed"
    seeds: List[int] = []
    for part in str(text).replace(" ", "").split(","):
        m = re.fullmatch(r"(\d+)(?:-(\d+))?", part)
        if not m:
            raise ConfigError(f"--seeds {text!r} is not a seed range; {valid}")
        lo, hi = int(m.group(1)), int(m.group(2) if m.group(2) is not None else m.group(1))
        if lo > hi:
            raise ConfigError(f"--seeds {text!r} is an empty range ({lo} > {hi}); {valid}")
        if hi > MAX_SEED or hi - lo >= MAX_RUNS:
            raise ConfigError(f"--seeds {text!r} is out of range; valid: seeds 0..{MAX_SEED}, "
                              f"at most {MAX_RUNS:,} of them")
        seeds.extend(range(lo, hi + 1))
    if len(set(seeds)) != len(seeds):
        raise ConfigError(f"--seeds {text!r} names a seed twice; {valid}")
    return seeds


def parse_grid(items: Sequence[str]) -> Dict[str, List[str]]:
    """``["actors.precision=fp32,int8-dynamic"]`` -> ``{"actors.precision": ["fp32", "int8-dynamic"]}``.

    Values are split on commas outside brackets, so ``learner.resources={"GPU": 1}`` stays one value.
    """
    grid: Dict[str, List[str]] = {}
    for item in items:
        key, sep, text = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ConfigError(f"--grid {item!r} must look like KEY=V1,V2,...")
        if key in grid:
            raise ConfigError(f"--grid names {key!r} twice; valid: one --grid per key")
        grid[key] = _split_values(text)
        if not grid[key] or any(v == "" for v in grid[key]):
            raise ConfigError(f"--grid {item!r} has an empty value; valid: KEY=V1,V2,... with non-empty values")
    return grid


def _split_values(text: str) -> List[str]:
    values, depth, cur = [], 0, ""
    for ch in text:
        depth += ch in "[{("
        depth -= ch in "]})"
        if ch == "," and depth == 0:
            values.append(cur.strip())
            cur = ""
        else:
            cur += ch
    values.append(cur.strip())
    return values if text.strip() else []


def check_keys(spec: SweepSpec) -> None:
    """Refuse an empty grid axis, a duplicate value and the keys the sweep sets itself."""
    entry_sets = [o for e in spec.entries() for o in e.overrides]
    for item in spec.overrides + entry_sets:
        if "=" not in item:
            raise ConfigError(f"--set {item!r} must look like KEY=VALUE")
    for key in [o.partition("=")[0].strip() for o in spec.overrides + entry_sets] + list(spec.grid):
        if key in RESERVED_KEYS:
            raise ConfigError(f"{key!r} is set by the sweep itself (--seeds, --executor, --out); "
                              f"valid: any other config key")
    for key, values in spec.grid.items():
        if not values:
            raise ConfigError(f"the grid's {key!r} has no values; valid: a non-empty list")
        if len(set(values)) != len(values):
            raise ConfigError(f"the grid's {key!r} names a value twice: {values}")
    if not spec.seeds:
        raise ConfigError("the spec has no seeds; valid: a range such as 0-9")


def safe_part(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._=+,-]+", "-", text)


def run_name(config: str, setting: Dict[str, str], seed: int) -> str:
    """``<config stem>__<key>=<value>__...__s<seed>``, sanitized and at most :data:`MAX_NAME` characters.

    ``config`` is a config file path (its stem is used) or a config entry's name.
    """
    stem = os.path.splitext(os.path.basename(config))[0] if config.endswith((".yaml", ".yml")) else config
    parts = [safe_part(stem).lstrip(".-=+,") or "config"] + [safe_part(f"{k}={v}") for k, v in setting.items()]
    name = "__".join(parts + [f"s{seed}"])
    if len(name) > MAX_NAME:
        digest = hashlib.sha256(name.encode()).hexdigest()[:10]
        name = f"{name[:MAX_NAME - 24]}~{digest}__s{seed}".replace("~", "-")
    return check_run_name(name)


def check_run_name(name: Any) -> str:
    """``name`` if it is one safe path component (no separators, no ``..``, no leading dot), else ConfigError."""
    if (not isinstance(name, str) or not _NAME_OK.match(name) or ".." in name or len(name) > MAX_NAME):
        raise ConfigError(f"run name {name!r} is not a safe directory name; valid: [A-Za-z0-9._=+,-], "
                          f"no '..', at most {MAX_NAME} characters")
    return name


def expand(spec: SweepSpec) -> List[RunSpec]:
    """Every (config, setting, seed), configs outermost and seeds innermost; refuses clashing names."""
    check_keys(spec)
    keys = list(spec.grid)
    settings = [dict(zip(keys, combo)) for combo in itertools.product(*(spec.grid[k] for k in keys))]
    runs: List[RunSpec] = []
    seen: Dict[str, str] = {}
    for entry in spec.entries():
        config = entry.config
        if not os.path.isfile(config):
            raise ConfigError(f"config file {config!r} does not exist; valid: a YAML config such as "
                              "configs/default.yaml")
        for setting in settings:
            overrides = [*THREAD_OVERRIDES, *entry.overrides, *spec.overrides,
                         *(f"{k}={v}" for k, v in setting.items())]
            for seed in (spec.seeds if entry.seeds is None else entry.seeds):
                name = run_name(entry.name or config, setting, seed)
                if name in seen:
                    raise ConfigError(f"two runs would share the directory name {name!r} ({seen[name]} and "
                                      f"{config}); valid: config files or entry names that differ")
                seen[name] = config
                runs.append(RunSpec(name, os.path.abspath(config), seed, dict(setting), overrides, entry.name))
    if len(runs) > MAX_RUNS:
        raise ConfigError(f"the sweep has {len(runs):,} runs; valid: at most {MAX_RUNS:,}")
    return runs


def validate_runs(runs: Sequence[RunSpec]) -> None:
    """Build every run's config (file, overrides, seed) as ``pipelines.train`` will; the first error, one line."""
    from core.config import load_config
    checked: Dict[tuple, None] = {}
    for run in runs:
        key = (run.config, tuple(run.overrides))
        if key in checked:     # the seed is range-checked by parse_seeds; the rest is the same config
            continue
        try:
            load_config(run.config, [*run.overrides, f"seed={run.seed}", "executor=local"])
        except ConfigError as e:
            raise ConfigError(f"run {run.name}: {e}") from None
        checked[key] = None
