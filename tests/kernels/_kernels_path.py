"""Make `hft_infer.kernels` importable from this checkout when the package is not
installed (a bare GPU machine): pyproject maps the folder kernels/ to it."""

from __future__ import annotations

import importlib.util
import os
import sys
import types


def ensure_kernels_importable() -> None:
    try:
        import hft_infer.kernels  # noqa: F401
        return
    except ImportError:
        pass
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    if "hft_infer" not in sys.modules:
        try:
            sys.path.insert(0, root)
            import hft_infer  # noqa: F401
        except ImportError:
            pkg = types.ModuleType("hft_infer")
            pkg.__path__ = [os.path.join(root, "hft_infer")]
            sys.modules["hft_infer"] = pkg
    spec = importlib.util.spec_from_file_location(
        "hft_infer.kernels", os.path.join(root, "kernels", "__init__.py"),
        submodule_search_locations=[os.path.join(root, "kernels")])
    mod = importlib.util.module_from_spec(spec)
    sys.modules["hft_infer.kernels"] = mod
    spec.loader.exec_module(mod)
