"""Every config key with its type, default and meaning, read from the section dataclasses
themselves (:mod:`hicache.config.sections`): a section's meaning is its docstring, a key's is
the comment above its field. So ``hicache-sim config keys`` cannot drift from the code.

Standard library only.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import textwrap
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, get_type_hints

from hicache import hardware
from hicache.config.base import ROUTER_POLICIES
from hicache.config.pd import PD_RETRACTION_BACKUPS, PD_ROUTERS, PD_TRANSFERS
from hicache.config.sections import (
    CLOSED_LOOP_MODES,
    EVICTION_CHOICES,
    HOST_MEMORY_MODES,
    IO_BACKENDS,
    KV_DTYPES,
    MEM_LAYOUTS,
    OUTPUT_MODES,
    OUTPUT_REUSE_MODES,
    SCHEDULE_POLICIES,
    SCHEDULER_ENGINES,
    SECTIONS,
    STORAGE_BACKENDS,
    WEIGHT_DTYPES,
)
from hicache.policy import WRITE_POLICIES
from hicache.policy.storage import PREFETCH_POLICIES
from hicache.versions import SGLANG_VERSIONS

#: The keys that take one of a few names, and those names.
CHOICES: dict[str, tuple[str, ...]] = {
    "model.name": tuple(hardware.MODELS),
    "model.weight_dtype": WEIGHT_DTYPES,
    "model.kv_dtype": KV_DTYPES,
    "gpu.name": tuple(hardware.GPUS),
    "link.name": ("", *hardware.LINKS),
    "link.io_backend": IO_BACKENDS,
    "link.mem_layout": MEM_LAYOUTS,
    "cache.write_policy": tuple(WRITE_POLICIES),
    "cache.eviction": EVICTION_CHOICES,
    "scheduler.policy": SCHEDULE_POLICIES,
    "scheduler.engine": SCHEDULER_ENGINES,
    "workload.closed_loop": CLOSED_LOOP_MODES,
    "workload.outputs": OUTPUT_MODES,
    "workload.output_reuse": OUTPUT_REUSE_MODES,
    "router.policy": ROUTER_POLICIES,
    "storage.backend": STORAGE_BACKENDS,
    "storage.prefetch_policy": PREFETCH_POLICIES,
    "storage.shared": ("auto", "yes", "no"),
    "sglang.version": tuple(SGLANG_VERSIONS),
    "cache.host_memory_mode": HOST_MEMORY_MODES,
    "pd.transfer": PD_TRANSFERS,
    "pd.prefill_router": PD_ROUTERS,
    "pd.decode_router": PD_ROUTERS,
    "pd.decode_retraction_backup": PD_RETRACTION_BACKUPS,
}


@dataclass(frozen=True)
class KeyDoc:
    """One config key: ``section.key``, its type name, default and meaning."""

    section: str
    key: str
    type: str
    default: Any
    doc: str
    choices: tuple[str, ...] = ()

    @property
    def dotted(self) -> str:
        return f"{self.section}.{self.key}"


def _field_comments(cls: type) -> dict[str, str]:
    """Field name -> the comment lines right above its line in ``cls``'s source, joined."""
    try:
        source = textwrap.dedent(inspect.getsource(cls))
    except (OSError, TypeError):  # no source (a frozen build): keys are still listed
        return {}
    lines = source.splitlines()
    out: dict[str, str] = {}
    body = ast.parse(source).body[0]
    assert isinstance(body, ast.ClassDef)
    for node in body.body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            comment: list[str] = []
            i = node.lineno - 2
            while i >= 0 and lines[i].strip().startswith("#"):
                comment.insert(0, lines[i].strip().lstrip("#").strip())
                i -= 1
            out[node.target.id] = " ".join(comment)
    return out


def _default(f: dataclasses.Field[Any]) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return None


def section_doc(section: str) -> str:
    """The first paragraph of a section's docstring, on one line."""
    doc = inspect.getdoc(SECTIONS[section]) or ""
    return " ".join(doc.split("\n\n")[0].split())


def key_docs() -> list[KeyDoc]:
    """Every key of every section, in file order."""
    docs = []
    for name, cls in SECTIONS.items():
        hints = get_type_hints(cls)
        comments = _field_comments(cls)
        for f in dataclasses.fields(cls):
            typ = hints[f.name]
            docs.append(
                KeyDoc(
                    section=name,
                    key=f.name,
                    type=getattr(typ, "__name__", str(typ)),
                    default=_default(f),
                    doc=comments.get(f.name, ""),
                    choices=CHOICES.get(f"{name}.{f.name}", ()),
                )
            )
    return docs


def toml_value(value: Any) -> str:
    """``value`` as TOML writes it (``true``, ``"text"``, ``0.9``)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return repr(value)


def format_keys(flags: Mapping[str, str] | None = None, width: int = 100) -> str:
    """The keys as text: per section its meaning, then ``key = default  (type)`` and the
    meaning of each key, its choices and (from ``flags``, key -> SGLang flag) the SGLang flag
    that sets it, wrapped to ``width``."""
    out: list[str] = []
    section = None
    for d in key_docs():
        if d.section != section:
            section = d.section
            if out:
                out.append("")
            out.append(f"[{section}]  {section_doc(section)}")
        head = f"  {d.dotted} = {toml_value(d.default)}  ({d.type}"
        flag = (flags or {}).get(d.dotted)
        out.append(head + (f"; SGLang {flag})" if flag else ")"))
        text = d.doc
        if d.choices:
            shown = ", ".join(c if c else toml_value(c) for c in d.choices)
            text += f" [choices: {shown}]"
        if text:
            out.extend(
                textwrap.wrap(
                    text.strip(), width, initial_indent="      ", subsequent_indent="      "
                )
            )
    return "\n".join(out)


__all__ = ["CHOICES", "KeyDoc", "format_keys", "key_docs", "section_doc", "toml_value"]
