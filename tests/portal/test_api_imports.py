"""The JSON API stands on the shared layers (selectors, services), never on the HTML package."""

import ast
import subprocess
import sys
from pathlib import Path

import portal.api

API_DIR = Path(portal.api.__file__).parent


def _imports(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def test_no_module_of_the_api_imports_from_the_html_package():
    offenders = {
        f"{path.name}: {name}"
        for path in API_DIR.glob("*.py")
        for name in _imports(path)
        if name == "portal.web" or name.startswith("portal.web.")
    }
    assert not offenders


def test_loading_the_api_loads_nothing_of_the_html_package():
    code = (
        "import os, sys, django\n"
        "os.environ.setdefault('DJANGO_SETTINGS_MODULE', 'portal.settings')\n"
        "django.setup()\n"
        "import portal.api.views, portal.api.urls\n"
        "print(sorted(m for m in sys.modules if m == 'portal.web' or m.startswith('portal.web.')))"
    )
    root = API_DIR.parent.parent
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=root, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "[]", out.stdout + out.stderr
