"""`make clean` and `make clean-all`: remove what the course made again on demand, after moving what it cannot make
again — trained models, training states and (clean-all) the learner's notebooks — to a dated backup.

    python tools/clean.py          course-output/, build/ and the egg-info go; trained models and states first
                                   move to backups/<date>/course-output/…
    python tools/clean.py --all    also my-notebooks/ (moved to backups/<date>/my-notebooks/, never deleted)

Standard library only: `make clean-all` runs it with any Python 3 before it removes .venv.
"""

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

OUTPUTS = ("course-output", "build")  # made again by the course (engines, exports, the site)
NOTEBOOKS = "my-notebooks"  # the learner's copies: moved, never deleted
BACKUPS = "backups"
WEIGHTS = ("*.safetensors", "*.bin", "*.safetensors.index.json")


def _json(path: Path):
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def is_engine(folder: Path) -> bool:
    """True for an engine directory of the package (its manifest names the format): built again on demand."""
    manifest = _json(folder / "manifest.json")
    return isinstance(manifest, dict) and str(manifest.get("format", "")).startswith("qwenvl-lab-engine/")


def is_trained_model(folder: Path) -> bool:
    """True for a Qwen-VL checkpoint (config.json with a vision tower, and weights) that is not an engine."""
    config = _json(folder / "config.json")
    has_weights = any(any(folder.glob(pattern)) for pattern in WEIGHTS)
    return isinstance(config, dict) and "visual" in config and has_weights and not is_engine(folder)


def to_keep(outputs: Path) -> list:
    """What under `outputs` cannot be made again: trained models (whole folders) and training states (state.pt)."""
    kept = []
    for path in sorted(outputs.rglob("*")):
        if any(k in path.parents for k in kept):  # inside a model already kept whole
            continue
        if path.is_dir() and not path.is_symlink() and is_trained_model(path):
            kept.append(path)
        elif path.is_file() and path.name == "state.pt":
            kept.append(path)
    return kept


def backup_folder(root: Path) -> Path:
    """A new dated folder under backups/."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    folder, n = root / BACKUPS / stamp, 1
    while folder.exists():
        n += 1
        folder = root / BACKUPS / f"{stamp}-{n}"
    return folder


def clean(root: Path, everything: bool = False, say=print) -> list:
    """Back up, then remove; returns where each backed-up thing went."""
    root = Path(root)
    backup = backup_folder(root)
    moved = []
    outputs = root / OUTPUTS[0]
    keep = to_keep(outputs) if outputs.is_dir() else []
    if everything and (root / NOTEBOOKS).exists():
        keep.append(root / NOTEBOOKS)
    for path in keep:
        target = backup / path.relative_to(root)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(str(path), str(target))  # a rename on the same disk
        moved.append(target)
        say(f"moved {path.relative_to(root)} to {target.relative_to(root)}")
    for name in OUTPUTS:
        path = root / name
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        elif path.exists() or path.is_symlink():
            path.unlink()
    for info in root.glob("*.egg-info"):
        shutil.rmtree(info)
    if moved:
        say(f"your trained models, training states and notebooks are in {backup.relative_to(root)}/")
    return moved


def main(argv=None) -> int:
    """Command line: clean the checkout this script lies in (or --root)."""
    parser = argparse.ArgumentParser(prog="python tools/clean.py", description=__doc__.splitlines()[0])
    parser.add_argument("--all", action="store_true", help="also my-notebooks/ (moved to a dated backup)")
    parser.add_argument("--root", type=Path, default=Path(__file__).resolve().parents[1], help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    try:
        clean(args.root, args.all)
    except OSError as err:
        print(f"python tools/clean.py: {err}; nothing more was removed", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
