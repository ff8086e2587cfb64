"""Every fault type, one module each; importing this package registers them all."""

from importlib import import_module
from pathlib import Path

for _module in sorted(p.stem for p in Path(__file__).parent.glob("*.py") if p.stem != "__init__"):
    import_module(f"{__name__}.{_module}")
