#!/usr/bin/env python3
"""Print the README's config reference (markdown) from hft_infer/config.py.

The field docstrings in config.py are the single source; tests check that
README.md holds exactly this output between its config-reference markers.

    python tools/gen_config_reference.py            # print
    python tools/gen_config_reference.py --write    # update README.md in place
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
START = "<!-- config-reference:start -->"
END = "<!-- config-reference:end -->"


def _default(node: ast.expr | None) -> str:
    if node is None:
        return ""
    text = ast.unparse(node)
    m = re.search(r"default_factory=lambda: (.*)\)$", text)
    if m:
        text = m.group(1)
    text = {"True": "true", "False": "false"}.get(text, text)
    return text if not text.startswith(("'", '"')) else repr(ast.literal_eval(text)).replace("'", '"')


def _type(node: ast.expr) -> str:
    text = ast.unparse(node)
    text = text.replace("NonNegInt", "int >= 0").replace("PosInt", "int > 0")
    text = re.sub(r"Annotated\[(\w+), Meta\(([^)]*)\)\]", r"\1 (\2)", text)
    text = re.sub(r"Literal\[([^\]]*)\]", lambda m: "one of " + m.group(1).replace("'", '"'), text)
    return text.replace("|", "or")


def reference() -> str:
    tree = ast.parse((ROOT / "hft_infer" / "config.py").read_text())
    classes = {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}
    root = classes["Config"]
    out = []
    for st in root.body:
        if not isinstance(st, ast.AnnAssign):
            continue
        section = st.target.id
        cls = classes[ast.unparse(st.annotation)]
        out.append(f"### `[{section}]`\n")
        out.append("| key | type | default | meaning |")
        out.append("| --- | --- | --- | --- |")
        body = cls.body
        for i, f in enumerate(body):
            if not isinstance(f, ast.AnnAssign):
                continue
            doc = ""
            nxt = body[i + 1] if i + 1 < len(body) else None
            if isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant):
                doc = " ".join(str(nxt.value.value).split())
            cell = doc.replace("|", "&#124;")
            out.append(f"| `{f.target.id}` | {_type(f.annotation)} | `{_default(f.value)}` | {cell} |")
        out.append("")
    return "\n".join(out)


def main() -> int:
    text = reference()
    if "--write" in sys.argv:
        readme = ROOT / "README.md"
        s = readme.read_text()
        a, b = s.index(START) + len(START), s.index(END)
        readme.write_text(s[:a] + "\n" + text + "\n" + s[b:])
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
