"""Loading a config: TOML files, ``--set section.key=value`` overrides parsed by the key's type,
and the dict form stored in run directories; every error is a :class:`ConfigError`."""

from __future__ import annotations

import dataclasses
import math
import tomllib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, get_type_hints

from hicache.config.base import ConfigError
from hicache.config.sections import SECTIONS, SimConfig, _Section


def _field_types(cls: type[_Section]) -> dict[str, type]:
    hints = get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls)}


def _coerce(value: Any, typ: type, where: str) -> Any:
    """A parsed TOML/JSON value checked (and widened: int -> float, integral float -> int)."""
    if typ is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(where, f"expected true or false, got {value!r}")
    if typ is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        raise ConfigError(where, f"expected an integer, got {value!r}")
    if typ is float:
        if isinstance(value, int | float) and not isinstance(value, bool):
            if not math.isfinite(value):
                raise ConfigError(where, f"expected a finite number, got {value!r}")
            return float(value)
        raise ConfigError(where, f"expected a number, got {value!r}")
    if isinstance(value, str):
        return value
    raise ConfigError(where, f"expected a string, got {value!r}")


def _parse_text(text: str, typ: type, where: str) -> Any:
    """A ``--set`` value (always text) parsed by the field's type."""
    t = text.strip()
    if typ is bool:
        low = t.lower()
        if low in ("true", "1"):
            return True
        if low in ("false", "0"):
            return False
        raise ConfigError(where, f"expected true/false/1/0, got {text!r}")
    if typ is int:
        try:
            return int(t)
        except ValueError:
            pass
        try:
            return _coerce(float(t), int, where)
        except ValueError:
            raise ConfigError(where, f"expected an integer, got {text!r}") from None
    if typ is float:
        try:
            number = float(t)
        except ValueError:
            raise ConfigError(where, f"expected a number, got {text!r}") from None
        return _coerce(number, float, where)
    if len(t) >= 2 and t[0] == t[-1] and t[0] in "'\"":
        t = t[1:-1]
    return t


def _split_key(dotted: str, source: str | None) -> tuple[str, str, type]:
    """``section.key`` -> (section, key, field type), or ConfigError naming what is unknown."""
    section, sep, key = dotted.partition(".")
    if not sep or not section or not key:
        raise ConfigError(dotted, "expected section.key", source)
    if section not in SECTIONS:
        raise ConfigError(
            dotted, f"unknown section {section!r}; choices: {', '.join(SECTIONS)}", source
        )
    types = _field_types(SECTIONS[section])
    if key not in types:
        raise ConfigError(dotted, f"unknown key; {section} has: {', '.join(types)}", source)
    return section, key, types[key]


def _read_mapping(
    data: Mapping[str, Any], source: str | None
) -> tuple[dict[str, dict[str, Any]], dict[str, str | None]]:
    """Typed values per section from a parsed TOML/JSON mapping, and the source of each."""
    values: dict[str, dict[str, Any]] = {}
    origin: dict[str, str | None] = {}
    for section, body in data.items():
        if section not in SECTIONS:
            raise ConfigError(section, f"unknown section; choices: {', '.join(SECTIONS)}", source)
        if not isinstance(body, Mapping):
            raise ConfigError(section, "expected a table of keys", source)
        for key, value in body.items():
            where = f"{section}.{key}"
            _, _, typ = _split_key(where, source)
            try:
                values.setdefault(section, {})[key] = _coerce(value, typ, where)
            except ConfigError as e:
                raise e.with_source(source) from None
            origin[where] = source
    return values, origin


def _build(
    values: Mapping[str, Mapping[str, Any]],
    origin: Mapping[str, str | None],
    fallback: str | None,
) -> SimConfig:
    """Construct (and so validate) a SimConfig, attributing errors to where the value came from."""
    try:
        sections: dict[str, Any] = {n: c(**values.get(n, {})) for n, c in SECTIONS.items()}
        return SimConfig(**sections)
    except ConfigError as e:
        raise e.with_source(origin.get(e.field, fallback)) from None


def _apply_overrides(
    values: dict[str, dict[str, Any]], origin: dict[str, str | None], overrides: Sequence[str]
) -> None:
    for item in overrides:
        source = f"--set {item}"
        dotted, sep, text = item.partition("=")
        if not sep:
            raise ConfigError(item, "expected section.key=value", "--set")
        section, key, typ = _split_key(dotted.strip(), source)
        where = f"{section}.{key}"
        try:
            values.setdefault(section, {})[key] = _parse_text(text, typ, where)
        except ConfigError as e:
            raise e.with_source(source) from None
        origin[where] = source


def load_config(path: str | Path | None = None, overrides: Sequence[str] = ()) -> SimConfig:
    """Defaults, then the TOML file at ``path`` (if any), then each ``section.key=value`` in
    ``overrides`` in order; validated. Raises :class:`ConfigError` for an unreadable or invalid
    file, an unknown section or key, a value of the wrong type or out of range."""
    values: dict[str, dict[str, Any]] = {}
    origin: dict[str, str | None] = {}
    source = None if path is None else str(path)
    if path is not None:
        try:
            text = Path(path).read_text(encoding="utf-8")
        except OSError as e:
            raise ConfigError("", f"cannot read config: {e.strerror or e}", source) from None
        except UnicodeDecodeError:
            problem = "cannot read config: not a UTF-8 text (TOML) file"
            raise ConfigError("", problem, source) from None
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as e:
            raise ConfigError("", _not_toml(text, e), source) from None
        values, origin = _read_mapping(data, source)
    _apply_overrides(values, origin, overrides)
    return _build(values, origin, source)


def _not_toml(text: str, err: tomllib.TOMLDecodeError) -> str:
    """Why a ``--config`` file is not a config: a model's Hugging Face ``config.json`` (its
    shape: ``--set model.config=FILE``) or an SGLang launch command are named as such."""
    import json

    try:
        data = json.loads(text)
    except ValueError:
        data = None
    if isinstance(data, dict) and ("architectures" in data or "model_type" in data):
        return (
            "this is a model's Hugging Face config.json, not a hicache-sim config (TOML); give "
            "the model's shape with --set model.config=FILE (or --sglang-args '--model-path "
            "FOLDER' for the checkpoint folder)"
        )
    if isinstance(data, dict):
        return (
            "a JSON file, not TOML: write the config as [section] key = value (see "
            "hicache-sim config keys)"
        )
    if "--model-path" in text or "sglang.launch_server" in text:
        return "an SGLang launch command, not a config: pass it as --sglang-args '...'"
    return f"invalid TOML: {err}"


def with_overrides(cfg: SimConfig, overrides: Sequence[str]) -> SimConfig:
    """``cfg`` with ``section.key=value`` overrides applied and validated (for sweeps)."""
    values = {name: dict(body) for name, body in config_to_dict(cfg).items()}
    origin: dict[str, str | None] = {}
    _apply_overrides(values, origin, overrides)
    return _build(values, origin, None)


def config_to_dict(cfg: SimConfig) -> dict[str, dict[str, Any]]:
    """The resolved config as plain JSON-serializable data, ``{section: {key: value}}``, to be
    written beside every run; :func:`config_from_dict` reads it back to an equal config."""
    return {name: dataclasses.asdict(getattr(cfg, name)) for name in SECTIONS}


def config_from_dict(data: Mapping[str, Any], source: str | None = None) -> SimConfig:
    """The inverse of :func:`config_to_dict`; missing keys take defaults, unknown ones raise
    :class:`ConfigError` (attributed to ``source``, e.g. the ``config.json`` path)."""
    values, origin = _read_mapping(data, source)
    return _build(values, origin, source)
