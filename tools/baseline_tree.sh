#!/usr/bin/env bash
# A baseline tree for side-by-side runs (this tree against an earlier commit, in one session):
#
#   tools/baseline_tree.sh REV DIR [PYTHON]   # REV: a git revision, or a .tgz of
#                                             # `git archive REV hft_infer transport kernels replay configs`
#   DIR/py -m hft_infer bench ...             # runs REV's package (DIR/pkg/hft_infer)
#   PYTHONPATH=tools DIR/py tools/bench_models_cpu.py ...   # this tree's tool on REV's package
#
# The package is laid out as installed: pyproject.toml maps hft_infer.kernels to kernels/ (and
# transport, replay, configs), so they go inside DIR/pkg/hft_infer. An archive left at the
# repository's layout on PYTHONPATH has no hft_infer/kernels: those subpackages would silently
# come from the editable install, i.e. from *this* tree (a comparison of a kernels/ change then
# shows no difference). DIR/py puts DIR/pkg first on PYTHONPATH, keeps what was there after it (a
# device machine's wheels), and sets PYTHONSAFEPATH so a script's own folder does not shadow it.
set -eu
src=${1:?usage: tools/baseline_tree.sh REV|FILE.tgz DIR [PYTHON]}
dir=${2:?usage: tools/baseline_tree.sh REV|FILE.tgz DIR [PYTHON]}
py=$(command -v "${3:-python3}")
mkdir -p "$dir/pkg"
if [ -f "$src" ]; then
  tar xzf "$src" -C "$dir/pkg"
else
  git archive "$src" hft_infer transport kernels replay configs | tar x -C "$dir/pkg"
fi
for d in transport kernels replay configs; do
  rm -rf "${dir:?}/pkg/hft_infer/$d"
  mv "$dir/pkg/$d" "$dir/pkg/hft_infer/$d"
done
dir=$(cd "$dir" && pwd)
printf '#!/bin/sh\nPYTHONSAFEPATH=1 PYTHONPATH=%s/pkg${PYTHONPATH:+:$PYTHONPATH} exec %s "$@"\n' "$dir" "$py" > "$dir/py"
chmod +x "$dir/py"
echo "$dir/py"
