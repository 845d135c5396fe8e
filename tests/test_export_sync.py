"""transformer_lib/ must be exactly what exporting the notebooks produces (nobody edits it by hand)."""
import importlib.util
import shutil
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _load_exporter():
    spec = importlib.util.spec_from_file_location("export_package", ROOT / "scripts" / "export_package.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_package_matches_notebook_export(tmp_path):
    exporter = _load_exporter()
    # Same layout as the repo, so the header's relative notebook path comes out identical.
    shutil.copytree(ROOT / "notebooks", tmp_path / "notebooks",
                    ignore=shutil.ignore_patterns(".ipynb_checkpoints"))
    exporter.export_notebooks(tmp_path / "notebooks", tmp_path / "transformer_lib")

    fresh = {p.name: p.read_text(encoding="utf-8") for p in exporter.generated_files(tmp_path / "transformer_lib")}
    committed = {p.name: p.read_text(encoding="utf-8") for p in exporter.generated_files(ROOT / "transformer_lib")}
    assert fresh, "no notebook exported anything: is `#| default_exp` missing?"
    assert sorted(committed) == sorted(fresh), (
        "generated modules differ from the notebooks' exports; run `python scripts/export_package.py`")
    for name, text in fresh.items():
        assert committed[name] == text, (
            f"transformer_lib/{name} differs from its notebook's export. Edit the notebook, "
            "then run `python scripts/export_package.py` (never edit generated files by hand).")


def test_every_module_has_a_description():
    """`help(module)` and the website show `__doc__`: a module exported with `#| export OTHER` had none
    before scripts/export_package.py moved its description above nbdev's `__all__`."""
    import ast
    missing = [path.name for path in sorted((ROOT / "transformer_lib").rglob("*.py"))
               if ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) is None]
    assert not missing, f"modules without a docstring first: {missing}"
