"""Build the wheel, install it non-editable into a fresh venv and import every module from outside the checkout.

An editable install (``make install``) imports the checkout itself, so a package the wheel leaves out goes
unnoticed until a user runs ``pip install .``. This check:

1. builds the wheel from the working tree's files (tracked and untracked-but-not-ignored, copied to a temporary
   folder so the checkout gets no ``build/``), with this interpreter's setuptools (no build isolation, no index);
2. compares the wheel with the source: every ``.py`` file and every data file under the package roots, and every
   ``presets/*.yaml`` as ``trainer_core/builtin_presets/``, must be in it;
3. creates a fresh venv without pip, installs the wheel there with ``--no-deps`` (this venv's pip, run for that
   interpreter), then gives it the dependencies through a ``.pth`` line naming this venv's site-packages (a plain
   path line: the ``.pth`` files there, among them the editable install's finder, are not run);
4. from a temporary working directory, with ``python -I`` (no PYTHONPATH, no script folder on sys.path), imports
   every module the wheel's RECORD lists and checks that each one's file lies in the fresh venv; then reads the
   built-in presets through ``trainer_core.config.presets.builtin_dir()``.

Usage: ``.venv/bin/python scripts/check_wheel.py`` (exit 0 and one summary line, or exit 1 naming what is wrong).
"""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import zipfile
from pathlib import Path, PurePosixPath

REPO = Path(__file__).resolve().parent.parent
PACKAGE_ROOTS = ("trainer_core", "db", "ui", "gateway")  # setup.py's include list, without the globs
PRESETS_SOURCE, PRESETS_PACKAGE = "presets", "trainer_core/builtin_presets"


def source_files(repo: Path = REPO) -> list[str]:
    """The files a fresh clone plus this checkout's new files would hold (git's view: ignored files left out)."""
    out = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"], cwd=repo,
                         check=True, capture_output=True).stdout.decode()
    return sorted(p for p in out.split("\0") if p and (repo / p).is_file())


def expected_in_wheel(files: list[str]) -> set[str]:
    """Paths the wheel must hold: everything under the package roots (no bytecode) and the built-in presets."""
    expected = set()
    for path in files:
        parts = PurePosixPath(path).parts
        if "__pycache__" in parts or path.endswith((".pyc", ".pyo")):
            continue
        if parts[0] in PACKAGE_ROOTS:
            expected.add(path)
        elif parts[0] == PRESETS_SOURCE and len(parts) == 2 and path.endswith(".yaml"):
            expected.add(f"{PRESETS_PACKAGE}/{parts[1]}")
    return expected


def missing_inits(files: list[str]) -> list[str]:
    """Folders under the package roots that hold Python files but no __init__.py (discovery would skip them)."""
    present = set(files)
    folders = {str(PurePosixPath(p).parent) for p in files
               if p.endswith(".py") and PurePosixPath(p).parts[0] in PACKAGE_ROOTS}
    return sorted(f for f in folders if f"{f}/__init__.py" not in present)


def module_names(wheel_files: list[str]) -> list[str]:
    """Importable module names for the .py files of a wheel's listing (``a/b/__init__.py`` -> ``a.b``)."""
    names = []
    for path in wheel_files:
        parts = PurePosixPath(path).parts
        if not path.endswith(".py") or parts[0] not in PACKAGE_ROOTS:
            continue
        stem = parts[:-1] if parts[-1] == "__init__.py" else (*parts[:-1], parts[-1][:-3])
        names.append(".".join(stem))
    return sorted(names)


IMPORT_ALL = r"""
import importlib, json, sys, traceback
prefix, names, roots = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3])
problems, optional = [], {}
for name in names:
    try:
        module = importlib.import_module(name)
    except ModuleNotFoundError as missing:
        if (missing.name or "").partition(".")[0] in roots:
            problems.append(f"{name}: import failed: {missing}")
        else:  # an optional extra that this venv lacks (unsloth: the gpu extra); the file is in the wheel
            optional[name] = missing.name
        continue
    except BaseException:  # report every failing module, not only the first
        problems.append(f"{name}: import failed:\n{traceback.format_exc(limit=3)}")
        continue
    where = getattr(module, "__file__", None) or ""
    if not where.startswith(prefix):
        problems.append(f"{name}: imported from {where or 'nowhere (a namespace package)'}, not the installed wheel")
names_found = []
try:
    from trainer_core.config import presets
    folder = str(presets.builtin_dir())
    names_found = sorted(p.name for p in presets.builtin_dir().glob("*.yaml"))
    if not folder.startswith(prefix) or not names_found:
        problems.append(f"built-in presets read from {folder} ({names_found}), not from the installed wheel")
except BaseException:
    problems.append(f"built-in presets: {traceback.format_exc(limit=3)}")
print(json.dumps({"problems": problems, "presets": names_found, "optional": optional}))
"""


def run(cmd: list[str], **kwargs) -> subprocess.CompletedProcess:
    done = subprocess.run(cmd, capture_output=True, text=True, **kwargs)
    if done.returncode != 0:
        shown = " ".join(part if len(part) < 200 else part[:60] + "..." for part in cmd)
        raise SystemExit(f"check_wheel: {shown} failed ({done.returncode}):\n{done.stdout}{done.stderr}")
    return done


def check(repo: Path = REPO) -> list[str]:
    """Every problem found (empty when the wheel is complete and imports from a fresh venv)."""
    files = source_files(repo)
    problems = [f"{folder}/ has Python files but no __init__.py: package discovery leaves it out of the wheel"
                for folder in missing_inits(files)]
    with tempfile.TemporaryDirectory(prefix="check-wheel-") as tmp_name:
        tmp = Path(tmp_name)
        tree = tmp / "src"
        for path in files:  # a copy, so the build's build/ and egg-info never land in the checkout
            (tree / path).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(repo / path, tree / path)
        run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "--no-index",
             "-w", str(tmp / "dist"), str(tree)])
        wheel = next((tmp / "dist").glob("*.whl"))
        with zipfile.ZipFile(wheel) as archive:
            listed = [n for n in archive.namelist() if not n.endswith("/")]
        problems += [f"{path} is not in the wheel" for path in sorted(expected_in_wheel(files) - set(listed))]

        venv = tmp / "venv"
        run([sys.executable, "-m", "venv", "--without-pip", str(venv)])
        python = venv / "bin" / "python"
        # pip from this venv, run for the fresh interpreter: it sees only the fresh venv's (empty) packages
        run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps", "--no-index",
             str(wheel)])
        fresh_site = run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]
                         ).stdout.strip()
        ours = dict.fromkeys([sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]])
        (Path(fresh_site) / "zz_dependencies.pth").write_text("".join(f"{p}\n" for p in ours))
        names = module_names(listed)
        work = tmp / "elsewhere"
        work.mkdir()
        done = run([str(python), "-I", "-c", IMPORT_ALL, fresh_site, json.dumps(names),
                    json.dumps(PACKAGE_ROOTS)],
                   cwd=work, env={"PATH": "/usr/bin:/bin", "HOME": str(work)})
        result = json.loads(done.stdout.strip().splitlines()[-1])
        problems += result["problems"]
    if not problems:
        skipped = "".join(f"; {name} not imported: needs {dep} (an optional extra)"
                          for name, dep in result["optional"].items())
        print(f"check_wheel: {wheel.name} holds {len(names)} modules and {len(result['presets'])} presets; "
              f"all import from a fresh non-editable install{skipped}")
    return problems


def main() -> int:
    problems = check()
    for problem in problems:
        print(f"check_wheel: {problem}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
