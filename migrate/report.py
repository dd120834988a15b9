"""The migration report: per file each change and each site left alone, plus a summary.

``migration_report.json``::

    {"summary": {...},
     "files": [{"path", "changes": [{"line", "code", "before", "after", "target"}],
                "unconverted": [{"line", "code", "reason"}],
                "kept": [{"line", "code", "reason"}], "error"}]}

``changes`` whose ``before`` equals ``after`` are sites an import rewrite already
moved onto shim (listed so the report is a coverage table); ``kept`` are
constructs left as they are on purpose (``report`` rules, e.g. ``deepspeed.initialize``).
``error`` says why a file was not migrated (copied unchanged): it does not parse or decode, or it
is not Python at all (``"not Python: ..."``, e.g. binary data in a file named ``x.py``).
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

NOT_PYTHON = "not Python"  # how an ``error`` starts when the file is no Python source at all


@dataclass
class FileReport:
    path: str
    changes: list[dict] = field(default_factory=list)
    unconverted: list[dict] = field(default_factory=list)
    kept: list[dict] = field(default_factory=list)
    error: str | None = None


def is_python(report: FileReport) -> bool:
    return not (report.error or "").startswith(NOT_PYTHON)


def summarize(files: list[FileReport], *, files_changed: int, seconds: float) -> dict:
    """``files_scanned`` counts Python files; ``errors`` every file not migrated, ``not_python``
    those among them that are not Python source at all."""
    changes = Counter(c["code"] for f in files for c in f.changes)
    unconverted = Counter(u["code"] for f in files for u in f.unconverted)
    done, left = sum(changes.values()), sum(unconverted.values())
    return {
        "files_scanned": sum(map(is_python, files)),
        "files_changed": files_changed,
        "changes": done,
        "changes_by_rule": dict(sorted(changes.items())),
        "unconverted": left,
        "unconverted_by_rule": dict(sorted(unconverted.items())),
        "kept": sum(len(f.kept) for f in files),
        "conversion_rate": round(done / (done + left), 4) if done + left else 1.0,
        "errors": sum(f.error is not None for f in files),
        "not_python": sum(not is_python(f) for f in files),
        "seconds": round(seconds, 3),
    }


# The coverage table's packages, by rule family; amp_C (matched by name) is apex's CUDA extension.
PACKAGE_OF_FAMILY = {
    "APX": "apex", "DSP": "deepspeed", "DSC": "deepspeed", "CUD": "torch.cuda", "DST": "torch.distributed",
    "MEG": "megatron fused kernels", "TRC": "torch", "NPY": "numpy", "MPU": "mpu",
}
PACKAGE_ORDER = ("apex", "amp_C", "deepspeed", "torch.cuda", "torch.distributed", "megatron fused kernels")


def package_of(rule) -> str:
    if rule.match.split(".")[0] == "amp_C":
        return "amp_C"
    if rule.match.startswith("torch.utils.cpp_extension"):
        return "torch.utils.cpp_extension"
    return PACKAGE_OF_FAMILY.get(rule.family, rule.family)


def coverage(files: list[FileReport], rules: dict) -> dict[str, dict]:
    """Per package: sites found, converted, kept on purpose and unconverted, and for the unconverted
    the rules whose notes say what to do by hand."""
    table = {name: {"found": 0, "converted": 0, "kept": 0, "unconverted": 0, "by_hand": {}} for name in PACKAGE_ORDER}
    for key, column in (("changes", "converted"), ("kept", "kept"), ("unconverted", "unconverted")):
        for f in files:
            for entry in getattr(f, key):
                rule = rules.get(entry["code"])
                row = table.setdefault(package_of(rule) if rule else "other",
                                       {"found": 0, "converted": 0, "kept": 0, "unconverted": 0, "by_hand": {}})
                row["found"] += 1
                row[column] += 1
                if column == "unconverted":
                    row["by_hand"][entry["code"]] = row["by_hand"].get(entry["code"], 0) + 1
    return table


def _coverage_markdown(files: list[FileReport], rules: dict) -> list[str]:
    out = ["## Coverage by package", "",
           "| package | found | converted | kept | unconverted | by hand (each unconverted site is listed below) |",
           "| --- | ---: | ---: | ---: | ---: | --- |"]
    for name, row in coverage(files, rules).items():
        hand = "; ".join(f"{code} x{n}: {_one_line(rules[code].note if code in rules else '', 90)}"
                         for code, n in sorted(row["by_hand"].items())) or "-"
        out.append(f"| {name} | {row['found']} | {row['converted']} | {row['kept']} | {row['unconverted']} | {hand} |")
    return out + [""]


def to_json(summary: dict, files: list[FileReport]) -> str:
    """Every scanned Python file is listed, with empty lists where nothing applied."""
    return json.dumps({"summary": summary, "files": [asdict(f) for f in files]}, indent=2) + "\n"


def _one_line(text: str, limit: int | None = 80) -> str:
    """``text`` on one line for a table cell; cut to ``limit`` characters (code), or whole (``None``: prose)."""
    text = " ".join(text.split())
    if limit is not None and len(text) > limit:
        text = text[: limit - 3] + "..."
    return text.replace("|", "\\|")


def _after(change: dict) -> str:
    if not change["after"]:
        return "(removed)"
    if change["after"] == change["before"]:
        return f"(text unchanged, now `{change['target']}`)"
    return f"`{_one_line(change['after'])}`"


def to_markdown(summary: dict, files: list[FileReport], rules: dict) -> str:
    """A human-readable report; ``rules`` maps rule codes to their rules (for notes and safety)."""
    s = summary
    out = [
        "# Migration report",
        "",
        f"{s['files_scanned']} Python files scanned, {s['files_changed']} changed; "
        f"{s['changes']} changes, {s['unconverted']} unconverted "
        f"(conversion rate {s['conversion_rate']:.1%}), {s['kept']} kept on purpose, "
        f"{s['errors']} error{'' if s['errors'] == 1 else 's'}, {s['seconds']:.2f} s.",
        "",
    ]
    out += _coverage_markdown(files, rules)
    if s["changes_by_rule"] or s["unconverted_by_rule"]:
        out += ["Rules marked *review* rewrite something a person should look at (see the note).", "",
                "| rule | changes | unconverted | note |", "| --- | ---: | ---: | --- |"]
        for code in sorted(set(s["changes_by_rule"]) | set(s["unconverted_by_rule"])):
            rule = rules.get(code)
            note = _one_line(rule.note if rule else "", None)  # whole: a reviewer needs every sentence
            if rule is not None and rule.safety == "review":
                note = f"*review*: {note}"
            out.append(f"| {code} | {s['changes_by_rule'].get(code, 0)} | "
                       f"{s['unconverted_by_rule'].get(code, 0)} | {note} |")
        out.append("")
    for f in files:
        if f.error:
            out += [f"## {f.path}", "", f"Not migrated (copied unchanged): {f.error}", ""]
    for title, key in (("Unconverted", "unconverted"), ("Kept on purpose", "kept")):
        rows = [(f.path, e) for f in files for e in getattr(f, key)]
        if rows:
            out += [f"## {title}", "", "| file | line | rule | reason |", "| --- | ---: | --- | --- |"]
            out += [f"| {p} | {e['line']} | {e['code']} | {_one_line(e['reason'], None)} |" for p, e in rows]
            out.append("")
    changed = [f for f in files if f.changes]
    if changed:
        out += ["## Changes", ""]
        for f in changed:
            out += [f"### {f.path}", "", "| line | rule | before | after |", "| ---: | --- | --- | --- |"]
            for c in f.changes:
                out.append(f"| {c['line']} | {c['code']} | `{_one_line(c['before'])}` | {_after(c)} |")
            out.append("")
    return "\n".join(out)


def report_paths(json_path: Path) -> tuple[Path, Path]:
    """Where the JSON and Markdown reports go: ``--report PATH`` puts the Markdown beside it as ``.md``."""
    return json_path, json_path.with_suffix(".md")
