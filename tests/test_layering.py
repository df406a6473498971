"""The stages of DESIGN.md import only from the stages before them: data → features → sim → agent → loop →
checkpoint → folds → report (then trainer/train.py, the CLI and workflows/ on top). Read from the source (ast), so
an import inside a function counts too."""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STAGES = ("data", "features", "sim", "agent", "loop", "checkpoint", "folds", "report")
TOP = ("train", "cli", "bench")
"""Modules at the top of the trainer package: entry points no stage may import."""


def trainer_imports(path: Path) -> list[str]:
    """Every `trainer.*` module that `path` imports, at any depth of the file."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append(node.module)
        elif isinstance(node, ast.Import):
            found.extend(alias.name for alias in node.names)
    return [m for m in found if m.split(".")[0] == "trainer"]


def violations(root: Path) -> list[tuple[str, str]]:
    rank = {name: i for i, name in enumerate(STAGES)}
    bad = []
    for path in sorted((root / "trainer").rglob("*.py")):
        parts = path.relative_to(root / "trainer").parts
        if len(parts) < 2 or parts[0] not in rank:
            continue
        for module in trainer_imports(path):
            target = module.split(".")[1] if "." in module else ""
            if (target in rank and rank[target] > rank[parts[0]]) or target in TOP:
                bad.append((str(path.relative_to(root)), module))
    return bad


def test_no_stage_imports_a_later_stage_or_an_entry_point():
    assert violations(ROOT) == []


def test_the_check_sees_a_backward_import_even_inside_a_function(tmp_path):
    (tmp_path / "trainer" / "sim").mkdir(parents=True)
    (tmp_path / "trainer" / "sim" / "bad.py").write_text("def f():\n    from trainer.folds.windows import Window\n")
    (tmp_path / "trainer" / "folds").mkdir()
    (tmp_path / "trainer" / "folds" / "ok.py").write_text("from trainer.sim import Simulator\n")
    assert violations(tmp_path) == [("trainer/sim/bad.py", "trainer.folds.windows")]


def test_the_settings_module_imports_without_torch():
    """workflows/ reads presets and choices from trainer.settings (test_workflows_submit checks submit itself)."""
    import subprocess
    import sys

    code = "import sys, trainer.settings; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "False", out.stderr[-1000:]
